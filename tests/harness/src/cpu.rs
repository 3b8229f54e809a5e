//! CPU time spent by processes, read from `/proc`: a process by its id, the calling thread,
//! and the children this process has waited for. The bench charges each party of a run with
//! it; the server's tests check that an idle server spends none.

use std::io;
use std::path::Path;

/// Clock ticks a second in `/proc`'s times (`USER_HZ`): 100 on every architecture Linux
/// runs sluice on.
const TICKS_PER_SECOND: f64 = 100.0;

/// CPU seconds, user and system, of process `pid` (all its threads).
pub fn process(pid: u32) -> io::Result<f64> {
    stat_seconds(&Path::new("/proc").join(pid.to_string()).join("stat"), 11)
}

/// CPU seconds of process `pid`'s threads that are running, from the scheduler's own account
/// (`/proc/PID/task/*/schedstat`, in nanoseconds): finer than [`process`], whose ticks are
/// 10 ms, for spans of a second or so. Threads that have ended are not counted.
pub fn process_threads(pid: u32) -> io::Result<f64> {
    let tasks = Path::new("/proc").join(pid.to_string()).join("task");
    let mut nanoseconds: u64 = 0;
    for task in std::fs::read_dir(&tasks)
        .map_err(|e| io::Error::new(e.kind(), format!("reading {}: {e}", tasks.display())))?
    {
        let path = task?.path().join("schedstat");
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            // The thread ended between the listing and the read.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("reading {}: {e}", path.display()),
                ));
            }
        };
        let on_cpu: u64 = text
            .split_whitespace()
            .next()
            .and_then(|field| field.parse().ok())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: no time on CPU in {text:?}", path.display()),
                )
            })?;
        nanoseconds += on_cpu;
    }
    Ok(nanoseconds as f64 / 1e9)
}

/// CPU seconds, user and system, of the calling thread.
pub fn this_thread() -> io::Result<f64> {
    stat_seconds(Path::new("/proc/thread-self/stat"), 11)
}

/// CPU seconds, user and system, of every child this process has waited for.
pub fn reaped_children() -> io::Result<f64> {
    stat_seconds(Path::new("/proc/self/stat"), 13)
}

/// The sum of the two tick counts at `index` and `index + 1` among the fields after the
/// command name (`utime stime` at 11, `cutime cstime` at 13; see proc(5)), in seconds.
fn stat_seconds(path: &Path, index: usize) -> io::Result<f64> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| io::Error::new(e.kind(), format!("reading {}: {e}", path.display())))?;
    let malformed = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    // The command name is in parentheses and may hold spaces: count fields after it.
    let (_, after_name) = text
        .rsplit_once(')')
        .ok_or_else(|| malformed(format!("{}: no command name in {text:?}", path.display())))?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| -> io::Result<u64> {
        fields.get(i).and_then(|f| f.parse().ok()).ok_or_else(|| {
            malformed(format!(
                "{}: field {} is not a tick count",
                path.display(),
                i + 3
            ))
        })
    };
    Ok((ticks(index)? + ticks(index + 1)?) as f64 / TICKS_PER_SECOND)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_thread_is_charged_for_its_work_and_no_more() {
        let (thread, whole) = (this_thread().unwrap(), process(std::process::id()).unwrap());
        let started = std::time::Instant::now();
        let mut x = 0u64;
        // A loaded machine gives this thread less than all of the wall time: wait for the
        // charge rather than assume it.
        while this_thread().unwrap() - thread < 0.2 {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(30),
                "30 s of spinning were never charged 0.2 s"
            );
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
        }
        let (spent, wall) = (
            this_thread().unwrap() - thread,
            started.elapsed().as_secs_f64(),
        );
        // One thread cannot run longer than the wall clock (give a tick either way).
        assert!(
            spent <= wall + 0.02,
            "charged {spent} s in {wall} s of wall time"
        );
        assert!(process(std::process::id()).unwrap() - whole >= spent - 0.02);
    }

    #[test]
    fn the_scheduler_charges_a_busy_process_what_proc_stat_does_to_the_tick() {
        // A child of one thread, none of whose threads end while it is read.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 3000000 ]; do i=$((i+1)); done"])
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let pid = child.id();
        let (spent, ticked) = (process_threads(pid).unwrap(), process(pid).unwrap());
        let wall = started.elapsed().as_secs_f64();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(spent > 0.0, "a busy shell was charged nothing");
        // The ticks lag the scheduler's account by up to two.
        assert!(
            (spent - ticked).abs() <= 0.03,
            "the scheduler charged {spent} s, /proc/PID/stat {ticked} s"
        );
        assert!(
            spent <= wall + 0.02,
            "charged {spent} s in {wall} s of wall time"
        );
    }

    #[test]
    fn a_child_is_charged_once_it_has_been_waited_for() {
        let before = reaped_children().unwrap();
        let started = std::time::Instant::now();
        let status = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"])
            .status()
            .unwrap();
        assert!(status.success());
        let (spent, wall) = (
            reaped_children().unwrap() - before,
            started.elapsed().as_secs_f64(),
        );
        assert!(
            spent >= 0.05,
            "a shell counting to 300,000 was charged {spent} s"
        );
        assert!(
            spent <= wall + 0.02,
            "charged {spent} s in {wall} s of wall time"
        );
    }
}
