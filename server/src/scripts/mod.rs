//! The Lua scripts, the only code sluice ever runs in Redis.
//!
//! Each algorithm's script is `lua/prelude.lua`, `lua/schedule.lua`, that algorithm's file
//! wrapped as the function `run`, and `lua/single.lua`, compiled in, with its SHA computed
//! once. The batch script decides every check of a request in one call, all or nothing: the
//! prelude, the schedule, every algorithm's file wrapped as a function, and `lua/batch.lua`;
//! the lease script and the fund script the same with `lua/ledger.lua`, then `lua/lease.lua`
//! or `lua/fund.lua`.
//! The same files also make one Redis Functions library ([`Library`]), which registers every
//! script as a function: called by `FCALL`, a script's definitions run once when the library
//! loads rather than on every call.
//! This module alone knows the scripts' arguments and replies: [`ScriptCall`] and
//! [`BatchCall`] turn checks into `KEYS`/`ARGV`, and [`decode_reply`] turns a reply's six
//! numbers back into a [`Verdict`], refusing anything else.

use std::sync::LazyLock;

use redis::Script;
use sluice_core::limit::Algorithm;

mod call;
mod reply;
#[cfg(test)]
mod tests;

pub use call::*;
pub use reply::*;

const PRELUDE: &str = include_str!("../../../lua/prelude.lua");
const SCHEDULE: &str = include_str!("../../../lua/schedule.lua");
const SINGLE: &str = include_str!("../../../lua/single.lua");
const BATCH: &str = include_str!("../../../lua/batch.lua");
const LEDGER: &str = include_str!("../../../lua/ledger.lua");
const LEASE: &str = include_str!("../../../lua/lease.lua");
const FUND: &str = include_str!("../../../lua/fund.lua");

/// Each algorithm's file, in `Algorithm::ALL` order (the batch script numbers them from 1).
const ALGORITHM_FILES: [(Algorithm, &str); 6] = [
    (
        Algorithm::FixedWindow,
        include_str!("../../../lua/fixed_window.lua"),
    ),
    (
        Algorithm::SlidingLog,
        include_str!("../../../lua/sliding_log.lua"),
    ),
    (
        Algorithm::SlidingWindow,
        include_str!("../../../lua/sliding_window.lua"),
    ),
    (
        Algorithm::TokenBucket,
        include_str!("../../../lua/token_bucket.lua"),
    ),
    (
        Algorithm::LeakyBucket,
        include_str!("../../../lua/leaky_bucket.lua"),
    ),
    (Algorithm::Gcra, include_str!("../../../lua/gcra.lua")),
];

/// Whether `algorithm`'s file is `lua/schedule.lua`'s virtual scheduling, whose key holds one
/// time and keeps the key's lease ledger beside it (`cell()` in `lua/prelude.lua`).
fn is_schedule(algorithm: Algorithm) -> bool {
    match algorithm {
        Algorithm::Gcra | Algorithm::TokenBucket | Algorithm::LeakyBucket => true,
        Algorithm::FixedWindow | Algorithm::SlidingLog | Algorithm::SlidingWindow => false,
    }
}

/// An algorithm's file as a function of one check (see `lua/prelude.lua`).
fn wrapped(body: &str) -> String {
    format!("function(key, now, cost, count_denied, commit, p, reach)\n{body}\nend")
}

/// A script's body as the callback of a library function: `KEYS` and `ARGV` are its
/// arguments there, as they are globals in a script.
fn callback(body: &str) -> String {
    format!("function(KEYS, ARGV)\n{body}\nend")
}

/// One script, which Redis runs either way: its text by `EVALSHA`, or the function the
/// [`Library`] registers for it by `FCALL`.
pub struct LimitScript {
    text: Script,
    function: String,
}

impl LimitScript {
    /// The script's text, for `EVALSHA` (and `SCRIPT LOAD`).
    pub fn text(&self) -> &Script {
        &self.text
    }

    /// The name of its function in the library, for `FCALL`.
    pub fn function(&self) -> &str {
        &self.function
    }

    /// `EVALSHA` of its text with `keys` and `args`; invoked, it loads the script and tries
    /// again on `NOSCRIPT`.
    pub fn evalsha(
        &self,
        keys: &[String],
        args: &[impl redis::ToRedisArgs],
    ) -> redis::ScriptInvocation<'_> {
        let mut invocation = self.text.prepare_invoke();
        for key in keys {
            invocation.key(key);
        }
        for arg in args {
            invocation.arg(arg);
        }
        invocation
    }

    /// `FCALL` of its function with `keys` and `args`.
    pub fn fcall(&self, keys: &[String], args: &[impl redis::ToRedisArgs]) -> redis::Cmd {
        // Sized up front (arguments are mostly short numbers): the command's buffers would
        // otherwise grow several times a call.
        let data = self.function.len() + keys.iter().map(String::len).sum::<usize>();
        let mut fcall =
            redis::Cmd::with_capacity(3 + keys.len() + args.len(), data + 16 * args.len() + 8);
        fcall
            .arg("FCALL")
            .arg(&self.function)
            .arg(keys.len())
            .arg(keys)
            .arg(args);
        fcall
    }
}

/// The scripts as one Redis Functions library. Its name, and every function's, carries a hash
/// of its code: servers of different versions sharing a Redis each load and call their own.
pub struct Library {
    /// `sluice_` and the hash.
    pub name: String,
    /// The library's code, as `FUNCTION LOAD` takes it.
    pub code: String,
}

impl Library {
    /// `FUNCTION LOAD REPLACE` of the library (on a Cluster the client sends it to every
    /// primary).
    pub fn load_command(&self) -> redis::Cmd {
        let mut load = redis::cmd("FUNCTION");
        load.arg("LOAD").arg("REPLACE").arg(&self.code);
        load
    }
}

/// Every algorithm's script, the batch script, the lease script and the fund script.
pub struct Scripts {
    /// By [`Algorithm::ordinal`].
    singles: Vec<LimitScript>,
    batch: LimitScript,
    lease: LimitScript,
    fund: LimitScript,
    library: Library,
}

/// The scripts, composed once per process.
pub static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| {
    // Every algorithm as ALGORITHMS[n], for the scripts that decide several keys.
    // SCHEDULES[n]: whether ALGORITHMS[n] is a schedule's, whose key keeps its lease ledger.
    let mut all =
        format!("{PRELUDE}\n{SCHEDULE}\nlocal ALGORITHMS = {{}}\nlocal SCHEDULES = {{}}\n");
    for (algorithm, body) in ALGORITHM_FILES {
        all.push_str(&format!(
            "-- {algorithm}\nALGORITHMS[{n}] = {}\nSCHEDULES[{n}] = {}\n",
            wrapped(body),
            is_schedule(algorithm),
            n = algorithm.ordinal() + 1,
        ));
    }
    let single_texts: Vec<String> = ALGORITHM_FILES
        .iter()
        .map(|(_, body)| {
            format!(
                "{PRELUDE}\n{SCHEDULE}\nlocal run = {}\n{SINGLE}",
                wrapped(body)
            )
        })
        .collect();
    let batch_text = format!("{all}{BATCH}");
    let lease_text = format!("{all}{LEDGER}\n{LEASE}");
    let fund_text = format!("{all}{LEDGER}\n{FUND}");

    // The library: the definitions once, then each script's body as a function. It is named
    // by the hash of its code, written first with a placeholder for the name.
    const NAME: &str = "@library@";
    let function = |name: &str, what: &str| format!("{name}_{what}");
    let mut code = format!("#!lua name={NAME}\n{all}{LEDGER}\n");
    for (algorithm, _) in ALGORITHM_FILES {
        code.push_str(&format!(
            "do\nlocal run = ALGORITHMS[{}]\nredis.register_function('{}', {})\nend\n",
            algorithm.ordinal() + 1,
            function(NAME, algorithm.name()),
            callback(SINGLE)
        ));
    }
    for (what, body) in [("batch", BATCH), ("lease", LEASE), ("fund", FUND)] {
        code.push_str(&format!(
            "redis.register_function('{}', {})\n",
            function(NAME, what),
            callback(body)
        ));
    }
    let name = format!("sluice_{}", &Script::new(&code).get_hash()[..16]);
    let code = code.replace(NAME, &name);
    let function = |what: &str| function(&name, what);
    let singles = ALGORITHM_FILES
        .iter()
        .zip(single_texts)
        .map(|((algorithm, _), text)| LimitScript {
            text: Script::new(&text),
            function: function(algorithm.name()),
        })
        .collect();
    Scripts {
        singles,
        batch: LimitScript {
            text: Script::new(&batch_text),
            function: function("batch"),
        },
        lease: LimitScript {
            text: Script::new(&lease_text),
            function: function("lease"),
        },
        fund: LimitScript {
            text: Script::new(&fund_text),
            function: function("fund"),
        },
        library: Library { name, code },
    }
});

impl Scripts {
    /// The script of `algorithm`.
    pub fn get(&self, algorithm: Algorithm) -> &LimitScript {
        &self.singles[algorithm.ordinal()]
    }

    /// The batch script.
    pub fn batch(&self) -> &LimitScript {
        &self.batch
    }

    /// The lease script.
    pub fn lease(&self) -> &LimitScript {
        &self.lease
    }

    /// The fund script: the lease script's grants for quota fundings, for less work.
    pub fn fund(&self) -> &LimitScript {
        &self.fund
    }

    /// Every script as one Redis Functions library.
    pub fn library(&self) -> &Library {
        &self.library
    }

    /// Every script with its algorithm.
    pub fn all(&self) -> impl Iterator<Item = (Algorithm, &LimitScript)> {
        Algorithm::ALL.into_iter().map(|a| (a, self.get(a)))
    }
}
