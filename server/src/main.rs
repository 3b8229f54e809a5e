//! The `sluice-server` binary: parse settings, log, serve until SIGINT or SIGTERM.

use std::process::ExitCode;

use std::future::Future;

use clap::Parser;
use sluice_server::config::{Args, LogFormat};
use sluice_server::tls::TlsFor;
use sluice_server::{ServerConfig, ServerThread};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing_subscriber::EnvFilter;

// Every request allocates a little (HTTP, JSON, the Redis command); mimalloc's thread-local
// free lists are cheaper than glibc's arenas for that (see BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (`mimalloc.h` of the v3 that libmimalloc-sys 0.1.49
/// builds, pinned in Cargo.toml): the option before `mi_option_use_numa_nodes`, which the crate
/// names where it does not name this one. The test below holds it to its default.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t =
    libmimalloc_sys::mi_option_use_numa_nodes - 1;

/// Memory freed is handed back to the OS at once, not a second later at the thread's next
/// allocation: a quota stream's buckets are freed when it ends, often by a worker thread that
/// then sits idle, and mimalloc kept those pages while it did (one stream of 50,000 buckets
/// left 56 to 65 MB behind after it ended; now 13 MB 3 s after and 25 MB 30 s after,
/// `scripts/rlqs-scale.sh`).
#[allow(unsafe_code)]
fn hand_back_freed_memory() {
    // SAFETY: mi_option_set only stores a number in mimalloc's table of options, which it
    // reads atomically; it is sound at any time, from any thread.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
}

/// No transparent huge pages for this process, as `MIMALLOC_ALLOW_THP=0` would have mimalloc
/// ask, but from the start of `main` (mimalloc reads its own option before `main` runs).
/// mimalloc advises huge pages for its arenas, and with freed memory handed back at once, a
/// quota stream's first report (50,000 buckets decoded, stored and asked for) had the kernel
/// fault and zero whole 2 MB pages again and again: 44 % of the server's CPU in the second
/// after four such reports, which then reached Redis later. Without them, every bucket of four
/// streams was assigned 2.6 to 3.2 s after its stream's first report where it took 3.1 to
/// 3.6 s, and the server held 14 MB 30 s after the streams ended where it held 34 to 39 MB
/// (`scripts/rlqs-scale.sh 50000 0.1 4`, four runs each).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn no_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE only sets a flag of this process' memory map, which the
    // kernel reads when it faults a page in; it touches no memory of ours. A kernel without
    // it answers EINVAL, and the process runs as before.
    let _ = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

#[cfg(not(target_os = "linux"))]
fn no_transparent_huge_pages() {}

fn main() -> ExitCode {
    no_transparent_huge_pages();
    hand_back_freed_memory();
    let args = Args::parse();
    init_logging(&args);
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("sluice-server: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(args: &Args) {
    // Checked when the flags were read.
    let filter = EnvFilter::new(&args.log);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

fn run(args: &Args) -> anyhow::Result<()> {
    let mut config = ServerConfig::try_from(args)?;
    let threads = match args.threads {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        n => n,
    };
    let Sockets { listeners, grpc } = Sockets::bind(args, threads)?;
    let (grpc_said, tls_said) = describe(&config, grpc.as_ref().map(|l| &l[0]))?;
    let listen = listeners[0].local_addr()?;
    // Each thread its share of the connection cap, its own sockets, runtime and Redis
    // connection; they share the metrics, and stop together.
    config.max_connections = config.max_connections.div_ceil(threads).max(1);
    let shared = ServerThread::first_of(threads);
    let (stop, stopping) = watch::channel(false);
    let mut grpc = grpc.map(Vec::into_iter);
    let mut listeners = listeners.into_iter();
    let (Some(primary_listener), primary_grpc) =
        (listeners.next(), grpc.as_mut().and_then(Iterator::next))
    else {
        anyhow::bail!("no listening socket");
    };
    let others = spawn_others(&config, &shared, listeners, grpc, &stopping)?;
    tracing::info!(%listen, grpc = %grpc_said, tls = tls_said, threads, topology = ?config.topology, "sluice-server started");
    let served = current_thread_runtime()?.block_on(serve(
        config,
        shared,
        primary_listener,
        primary_grpc,
        async move {
            shutdown_signal().await;
            let _ = stop.send(true);
        },
    ));
    // Whatever ended this thread's serving also dropped `stop`, which stops the others.
    drop(stopping);
    for other in others {
        match other.join() {
            Ok(result) => result?,
            Err(_) => anyhow::bail!("a server thread panicked"),
        }
    }
    served?;
    tracing::info!("stopped");
    Ok(())
}

/// Every thread's listening sockets: one each for the HTTP port, and for the gRPC port when
/// it has its own.
struct Sockets {
    listeners: Vec<std::net::TcpListener>,
    grpc: Option<Vec<std::net::TcpListener>>,
}

impl Sockets {
    fn bind(args: &Args, threads: usize) -> anyhow::Result<Sockets> {
        // Sockets are made in a runtime and handed to each thread's own.
        let binding = current_thread_runtime()?;
        let _entered = binding.enter();
        let grpc = match args.grpc_listen {
            Some(addr) => Some(sluice_server::bind_each(
                addr,
                threads,
                args.listen_backlog,
            )?),
            None => None,
        };
        Ok(Sockets {
            listeners: sluice_server::bind_each(args.listen, threads, args.listen_backlog)?,
            grpc,
        })
    }
}

/// Where gRPC is served and where TLS is on, for the line that says the server started.
fn describe(
    config: &ServerConfig,
    grpc: Option<&std::net::TcpListener>,
) -> anyhow::Result<(String, &'static str)> {
    let grpc = match (&config.rls, grpc) {
        (None, _) => "off".to_owned(),
        (Some(_), Some(l)) => l.local_addr()?.to_string(),
        (Some(_), None) => "on the same port".to_owned(),
    };
    let tls = match &config.tls {
        None => "off",
        Some(tls) => match tls.on {
            TlsFor::All => "on every listener",
            TlsFor::Grpc => "on the gRPC listener",
        },
    };
    Ok((grpc, tls))
}

/// Starts a thread serving each of `listeners` (with the matching gRPC listener), each
/// stopping when `stopping` turns true.
fn spawn_others(
    config: &ServerConfig,
    shared: &ServerThread,
    listeners: impl Iterator<Item = std::net::TcpListener>,
    mut grpc: Option<impl Iterator<Item = std::net::TcpListener>>,
    stopping: &watch::Receiver<bool>,
) -> anyhow::Result<Vec<std::thread::JoinHandle<anyhow::Result<()>>>> {
    let mut others = Vec::new();
    for (index, listener) in (1..).zip(listeners) {
        let grpc_listener = grpc.as_mut().and_then(Iterator::next);
        let thread = ServerThread {
            primary: false,
            ..shared.clone()
        };
        let config = config.clone();
        let mut stopping = stopping.clone();
        others.push(
            std::thread::Builder::new()
                .name(format!("sluice-server-{index}"))
                .spawn(move || {
                    current_thread_runtime()?.block_on(serve(
                        config,
                        thread,
                        listener,
                        grpc_listener,
                        async move {
                            let _ = stopping.wait_for(|s| *s).await;
                        },
                    ))
                })?,
        );
    }
    Ok(others)
}

/// Serves one thread's share on `listener` (and `grpc_listener`) in the current runtime.
async fn serve(
    config: ServerConfig,
    thread: ServerThread,
    listener: std::net::TcpListener,
    grpc_listener: Option<std::net::TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listener = TcpListener::from_std(listener)?;
    let grpc_listener = grpc_listener.map(TcpListener::from_std).transpose()?;
    sluice_server::serve_thread(config, thread, listener, grpc_listener, shutdown).await?;
    Ok(())
}

/// Every thread runs its own event loop: with a work-stealing runtime, threads woke one
/// another for each request and Redis answer, and two threads spent 2.4 times one thread's
/// CPU a decision at the same rate (`make bench`, real Envoy, 2026-11-26).
fn current_thread_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = interrupt => {}
        () = terminate => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(unsafe_code)]
    fn the_purge_delay_option_is_the_one_set() {
        // SAFETY: mi_option_get only reads a number from mimalloc's table of options.
        let purge_delay = || unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        let before = purge_delay();
        hand_back_freed_memory();
        let after = purge_delay();
        // v3/src/options.c: "{ 1000, ..., purge_delay }", "purge delay in milli-seconds"; the
        // options beside it default to 1 (eager_commit_delay) and 0 (use_numa_nodes).
        assert_eq!((before, after), (1000, 0));
    }

    #[cfg(target_os = "linux")]
    #[test]
    #[allow(unsafe_code)]
    fn transparent_huge_pages_are_off_once_asked() {
        no_transparent_huge_pages();
        // SAFETY: PR_GET_THP_DISABLE only reads the flag: 1 when set.
        let disabled = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        assert_eq!(disabled, 1);
    }
}
