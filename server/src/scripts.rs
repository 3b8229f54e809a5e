//! The Lua scripts, the only code sluice ever runs in Redis.
//!
//! Each algorithm's script is `lua/prelude.lua`, `lua/schedule.lua`, that algorithm's file
//! wrapped as the function `run`, and `lua/single.lua`, compiled in, with its SHA computed
//! once. The batch script decides every check of a request in one call, all or nothing: the
//! prelude, the schedule, every algorithm's file wrapped as a function, and `lua/batch.lua`.
//! The same files also make one Redis Functions library ([`Library`]), which registers every
//! script as a function: called by `FCALL`, a script's definitions run once when the library
//! loads rather than on every call.
//! This module alone knows the scripts' arguments and replies: [`ScriptCall`] and
//! [`BatchCall`] turn checks into `KEYS`/`ARGV`, and [`decode_reply`] turns a reply's six
//! numbers back into a [`Verdict`], refusing anything else.

use std::sync::LazyLock;

use redis::Script;
use sluice_core::algorithm::exact::Ticks;
use sluice_core::decimal;
use sluice_core::duration::Millis;
use sluice_core::key::ledger_key;
use sluice_core::limit::{Algorithm, Limit};
use sluice_core::verdict::Verdict;
use sluice_core::wire::{LeaseAsk, LeaseGrant};

const PRELUDE: &str = include_str!("../../lua/prelude.lua");
const SCHEDULE: &str = include_str!("../../lua/schedule.lua");
const SINGLE: &str = include_str!("../../lua/single.lua");
const BATCH: &str = include_str!("../../lua/batch.lua");
const LEASE: &str = include_str!("../../lua/lease.lua");

/// Each algorithm's file, in `Algorithm::ALL` order (the batch script numbers them from 1).
const ALGORITHM_FILES: [(Algorithm, &str); 6] = [
    (
        Algorithm::FixedWindow,
        include_str!("../../lua/fixed_window.lua"),
    ),
    (
        Algorithm::SlidingLog,
        include_str!("../../lua/sliding_log.lua"),
    ),
    (
        Algorithm::SlidingWindow,
        include_str!("../../lua/sliding_window.lua"),
    ),
    (
        Algorithm::TokenBucket,
        include_str!("../../lua/token_bucket.lua"),
    ),
    (
        Algorithm::LeakyBucket,
        include_str!("../../lua/leaky_bucket.lua"),
    ),
    (Algorithm::Gcra, include_str!("../../lua/gcra.lua")),
];

/// An algorithm's file as a function of one check (see `lua/prelude.lua`).
fn wrapped(body: &str) -> String {
    format!("function(key, now, cost, count_denied, commit, p)\n{body}\nend")
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

/// Every algorithm's script, the batch script and the lease script.
pub struct Scripts {
    /// By [`Algorithm::ordinal`].
    singles: Vec<LimitScript>,
    batch: LimitScript,
    lease: LimitScript,
    library: Library,
}

/// The scripts, composed once per process.
pub static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| {
    // Every algorithm as ALGORITHMS[n], for the scripts that decide several keys.
    let mut all = format!("{PRELUDE}\n{SCHEDULE}\nlocal ALGORITHMS = {{}}\n");
    for (algorithm, body) in ALGORITHM_FILES {
        all.push_str(&format!(
            "-- {algorithm}\nALGORITHMS[{}] = {}\n",
            algorithm.ordinal() + 1,
            wrapped(body)
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
    let lease_text = format!("{all}{LEASE}");

    // The library: the definitions once, then each script's body as a function. It is named
    // by the hash of its code, written first with a placeholder for the name.
    const NAME: &str = "@library@";
    let function = |name: &str, what: &str| format!("{name}_{what}");
    let mut code = format!("#!lua name={NAME}\n{all}");
    for (algorithm, _) in ALGORITHM_FILES {
        code.push_str(&format!(
            "do\nlocal run = ALGORITHMS[{}]\nredis.register_function('{}', {})\nend\n",
            algorithm.ordinal() + 1,
            function(NAME, algorithm.name()),
            callback(SINGLE)
        ));
    }
    for (what, body) in [("batch", BATCH), ("lease", LEASE)] {
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

    /// Every script as one Redis Functions library.
    pub fn library(&self) -> &Library {
        &self.library
    }

    /// Every script with its algorithm.
    pub fn all(&self) -> impl Iterator<Item = (Algorithm, &LimitScript)> {
        Algorithm::ALL.into_iter().map(|a| (a, self.get(a)))
    }
}

/// A limit's parameters as its script takes them (`p` in `lua/prelude.lua`): a window's limit
/// and length in microseconds; a bucket's interval and microsecond in ticks ([`Ticks`]), its
/// burst, and the shaping wait in microseconds.
pub fn script_params(limit: &Limit) -> Vec<u64> {
    match limit {
        Limit::FixedWindow(w) | Limit::SlidingLog(w) | Limit::SlidingWindow(w) => {
            vec![w.limit(), w.window().as_micros().unsigned_abs()]
        }
        Limit::TokenBucket(b) | Limit::Gcra(b) => {
            let t = Ticks::of(b);
            vec![t.per_unit, t.per_us, b.burst()]
        }
        Limit::LeakyBucket(l) => {
            let t = Ticks::of(l.bucket());
            let mut params = vec![t.per_unit, t.per_us, l.bucket().burst()];
            if let Some(max_wait) = l.mode().max_wait() {
                params.push(max_wait.as_micros().unsigned_abs());
            }
            params
        }
    }
}

/// Where a script call takes its time from: its first argument (see `clock` in
/// `lua/prelude.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptTime {
    /// The script reads Redis' `TIME` (one command more per call).
    Redis,
    /// Redis' clock as the server carries it between its reads of `TIME`
    /// ([`crate::clock::RedisClock`]), in microseconds.
    Carried(i64),
    /// A replay's virtual time in microseconds: keys then live at least an hour, since Redis
    /// expires them on its own clock.
    Replay(i64),
}

/// One check's call: the key, what is asked, and whether to consume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptCall {
    /// The algorithm, which picks the script.
    pub algorithm: Algorithm,
    /// `KEYS[1]`.
    pub key: String,
    /// Where the script takes its time from.
    pub time: ScriptTime,
    /// Units asked for.
    pub cost: u64,
    /// Whether a denial consumes too.
    pub count_denied: bool,
    /// Whether to consume (`false`: only ask, writing nothing).
    pub commit: bool,
    /// [`script_params`].
    pub params: Vec<u64>,
}

impl ScriptCall {
    /// The call deciding (and consuming) `cost` units of `limit` for `redis_key` at `time`.
    pub fn new(
        limit: &Limit,
        redis_key: String,
        time: ScriptTime,
        cost: u64,
        count_denied: bool,
    ) -> ScriptCall {
        ScriptCall {
            algorithm: limit.algorithm(),
            key: redis_key,
            time,
            cost,
            count_denied,
            commit: true,
            params: script_params(limit),
        }
    }

    /// The same call, only asking: it decides the same way and writes nothing.
    pub fn asking(&self) -> ScriptCall {
        ScriptCall {
            commit: false,
            ..self.clone()
        }
    }

    /// The same call at another cost.
    pub fn at_cost(&self, cost: u64) -> ScriptCall {
        ScriptCall {
            cost,
            ..self.clone()
        }
    }

    /// `ARGV` of the algorithm's script (see `lua/single.lua`).
    pub fn args(&self) -> Vec<ScriptArg> {
        let mut args = Vec::with_capacity(4 + self.params.len());
        args.push(ScriptArg::Time(self.time));
        args.push(ScriptArg::Number(self.cost));
        args.push(ScriptArg::Flag(self.count_denied));
        args.push(ScriptArg::Flag(self.commit));
        args.extend(self.params.iter().copied().map(ScriptArg::Number));
        args
    }

    /// The script to run.
    pub fn script(&self) -> &'static LimitScript {
        SCRIPTS.get(self.algorithm)
    }
}

/// One argument of a check's script call, written into the command as it is: a call has
/// several, and a string of its own for each would cost an allocation apiece.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptArg {
    /// The time argument: empty for Redis' own clock, the microseconds carried, or `r` and
    /// a replay's microseconds (see `clock()` in `lua/prelude.lua`).
    Time(ScriptTime),
    /// A count or a parameter, in decimal.
    Number(u64),
    /// `1` or `0`.
    Flag(bool),
}

impl ScriptArg {
    /// Hands the argument's text to `write`, from the stack but for a replay's time.
    fn with_text<R>(self, write: impl FnOnce(&str) -> R) -> R {
        let mut digits = itoa::Buffer::new();
        match self {
            ScriptArg::Time(ScriptTime::Redis) => write(""),
            ScriptArg::Time(ScriptTime::Carried(us)) => write(digits.format(us)),
            ScriptArg::Time(ScriptTime::Replay(us)) => write(&format!("r{}", digits.format(us))),
            ScriptArg::Number(n) => write(digits.format(n)),
            ScriptArg::Flag(b) => write(flag(b)),
        }
    }
}

impl redis::ToRedisArgs for ScriptArg {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        self.with_text(|text| out.write_arg(text.as_bytes()));
    }
}

impl std::fmt::Display for ScriptArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.with_text(|text| f.write_str(text))
    }
}

fn flag(b: bool) -> &'static str {
    if b { "1" } else { "0" }
}

/// Every check of one request, decided by one call of the batch script, all or nothing (see
/// `lua/batch.lua`). Keys must be distinct.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchCall {
    /// `KEYS`: each check's key.
    pub keys: Vec<String>,
    /// `ARGV`.
    pub args: Vec<ScriptArg>,
}

impl BatchCall {
    /// A batch of `(call, shadow)`, in order, at `time`. Each call's own time and `commit` are
    /// not used: the batch takes the time once and decides what to consume.
    pub fn new(time: ScriptTime, calls: Vec<(ScriptCall, bool)>) -> BatchCall {
        let mut args =
            Vec::with_capacity(2 + calls.iter().map(|(c, _)| 5 + c.params.len()).sum::<usize>());
        args.push(ScriptArg::Time(time));
        args.push(ScriptArg::Number(calls.len() as u64));
        let mut keys = Vec::with_capacity(calls.len());
        for (call, shadow) in calls {
            args.push(ScriptArg::Number(call.algorithm.ordinal() as u64 + 1));
            args.push(ScriptArg::Number(call.cost));
            args.push(ScriptArg::Flag(call.count_denied));
            args.push(ScriptArg::Flag(shadow));
            args.push(ScriptArg::Number(call.params.len() as u64));
            args.extend(call.params.iter().copied().map(ScriptArg::Number));
            keys.push(call.key);
        }
        BatchCall { keys, args }
    }

    /// The batch script.
    pub fn script(&self) -> &'static LimitScript {
        SCRIPTS.batch()
    }

    /// Splits the batch script's reply into one verdict per check.
    pub fn decode(&self, reply: &redis::Value) -> Result<Vec<Verdict>, BadReply> {
        let numbers = reply_numbers(reply, self.keys.len(), CHECK_NUMBERS)?;
        numbers
            .chunks_exact(CHECK_NUMBERS)
            .map(|six| verdict(six).ok_or_else(|| BadReply::of(reply)))
            .collect()
    }
}

/// Lease asks of one holder, granted by one call of the lease script (see `lua/lease.lua`).
/// On a Redis Cluster a call holds the asks of one key only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseCall {
    /// `KEYS`: each ask's state key and ledger key.
    pub keys: Vec<String>,
    /// `ARGV`.
    pub args: Vec<String>,
    /// Each ask's `held`, to tell the holder when the ledger counted fewer.
    pub held: Vec<u64>,
}

impl LeaseCall {
    /// The call for `asks` (each with its state key) of `holder`, at `time`.
    pub fn new<'a>(
        time: ScriptTime,
        holder: &str,
        asks: impl IntoIterator<Item = (&'a LeaseAsk, String)>,
    ) -> LeaseCall {
        // Lease calls are few (most requests are decided from what they grant), so their
        // arguments are strings, the holder's among them; numbers are written as a check's.
        let number = |n: u64| ScriptArg::Number(n).to_string();
        let mut call = LeaseCall {
            keys: Vec::new(),
            args: vec![
                ScriptArg::Time(time).to_string(),
                holder.to_owned(),
                String::new(),
            ],
            held: Vec::new(),
        };
        let mut count = 0;
        for (ask, state_key) in asks {
            call.held.push(ask.held);
            let params = script_params(&ask.limit);
            // The buckets' over-limit regime is a steady rate, which holders over it share as
            // a pace; windows admit in bursts by design, and are never paced (0 units).
            let (units, period) = match ask.limit {
                Limit::TokenBucket(_) | Limit::LeakyBucket(_) | Limit::Gcra(_) => {
                    ask.limit.nominal_rate()
                }
                _ => (0, Millis::MIN),
            };
            call.args
                .push(number(ask.limit.algorithm().ordinal() as u64 + 1));
            for n in [
                ask.want,
                ask.held,
                ask.returning,
                ask.demand,
                ask.terms.max_units,
                ask.terms.max_outstanding,
                ask.terms.ttl.as_micros().unsigned_abs(),
                units,
                period.as_micros().unsigned_abs(),
                params.len() as u64,
            ] {
                call.args.push(number(n));
            }
            call.args.extend(params.iter().copied().map(number));
            call.keys.push(ledger_key(&state_key));
            call.keys.insert(call.keys.len() - 1, state_key);
            count += 1;
        }
        call.args[2] = number(count);
        call
    }

    /// The lease script.
    pub fn script(&self) -> &'static LimitScript {
        SCRIPTS.lease()
    }

    /// Splits the script's reply into one grant per ask.
    pub fn decode(&self, reply: &redis::Value) -> Result<Vec<LeaseGrant>, BadReply> {
        let numbers = reply_numbers(reply, self.held.len(), LEASE_NUMBERS)?;
        numbers
            .chunks_exact(LEASE_NUMBERS)
            .zip(&self.held)
            .map(|(seven, &held)| grant(seven, held).ok_or_else(|| BadReply::of(reply)))
            .collect()
    }
}

/// A reply that is not what the scripts answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unexpected script reply {0}: expected a string of integers, six a check (allowed, limit, remaining, reset_ms, retry_after_ms, delay_ms) or seven a lease ask (granted, lease_ms, more_in_ms, limit, remaining, pace_us, held)"
)]
pub struct BadReply(pub String);

impl BadReply {
    fn of(reply: &redis::Value) -> BadReply {
        BadReply(match reply {
            redis::Value::BulkString(bytes) => format!("{:?}", String::from_utf8_lossy(bytes)),
            other => format!("{other:?}"),
        })
    }
}

/// The numbers of a check in a script's reply.
const CHECK_NUMBERS: usize = 6;
/// The numbers of a lease ask in a script's reply.
const LEASE_NUMBERS: usize = 7;

/// The integers of a script's reply to `entries` checks or lease asks of `width` numbers
/// each: one string, the numbers separated by spaces (`reply` in `lua/prelude.lua`).
fn reply_numbers(reply: &redis::Value, entries: usize, width: usize) -> Result<Vec<i64>, BadReply> {
    let redis::Value::BulkString(bytes) = reply else {
        return Err(BadReply::of(reply));
    };
    let mut numbers = Vec::with_capacity(width * entries);
    if !bytes.is_empty() {
        for word in bytes.split(|&b| b == b' ') {
            numbers.push(decimal::parse_signed(word).ok_or_else(|| BadReply::of(reply))?);
        }
    }
    if numbers.len() != width * entries {
        return Err(BadReply::of(reply));
    }
    Ok(numbers)
}

/// Turns a single check's reply into its verdict.
pub fn decode_reply(reply: &redis::Value) -> Result<Verdict, BadReply> {
    let numbers = reply_numbers(reply, 1, CHECK_NUMBERS)?;
    verdict(&numbers).ok_or_else(|| BadReply::of(reply))
}

/// A lease ask's seven numbers as its grant, for an ask that said `asked_held` units were
/// held; `None` if they cannot be one.
fn grant(seven: &[i64], asked_held: u64) -> Option<LeaseGrant> {
    let &[
        granted,
        lease_ms,
        more_in_ms,
        limit,
        remaining,
        pace_us,
        held,
    ] = seven
    else {
        return None;
    };
    let held = non_negative(held).filter(|&h| h <= asked_held)?;
    Some(LeaseGrant {
        granted: non_negative(granted)?,
        lease_ms: non_negative(lease_ms)?,
        more_in_ms: non_negative(more_in_ms)?,
        limit: non_negative(limit)?,
        remaining: non_negative(remaining)?,
        pace_us: non_negative(pace_us)?,
        kept: (held < asked_held).then_some(held),
    })
}

fn non_negative(v: i64) -> Option<u64> {
    u64::try_from(v).ok()
}

/// A check's six numbers as a verdict; `None` if they cannot be one.
fn verdict(six: &[i64]) -> Option<Verdict> {
    let &[
        allowed,
        limit,
        remaining,
        reset_ms,
        retry_after_ms,
        delay_ms,
    ] = six
    else {
        return None;
    };
    Some(Verdict {
        allowed: match allowed {
            0 => false,
            1 => true,
            _ => return None,
        },
        limit: non_negative(limit)?,
        remaining: non_negative(remaining)?,
        reset_ms: non_negative(reset_ms)?,
        retry_after_ms: match retry_after_ms {
            -1 if allowed == 0 => None,
            v => Some(non_negative(v)?),
        },
        delay_ms: non_negative(delay_ms)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_algorithm_has_its_own_script() {
        let hashes: std::collections::HashSet<&str> =
            SCRIPTS.all().map(|(_, s)| s.text().get_hash()).collect();
        assert_eq!(hashes.len(), 6);
    }

    #[test]
    fn the_library_registers_every_script_under_a_name_of_its_own() {
        let library = SCRIPTS.library();
        assert!(
            library
                .code
                .starts_with(&format!("#!lua name={}\n", library.name))
        );
        let functions: std::collections::HashSet<&str> = SCRIPTS
            .all()
            .map(|(_, s)| s.function())
            .chain([SCRIPTS.batch().function(), SCRIPTS.lease().function()])
            .collect();
        assert_eq!(functions.len(), 8);
        for function in functions {
            assert!(
                function.starts_with(&format!("{}_", library.name)),
                "{function}"
            );
            assert!(
                library
                    .code
                    .contains(&format!("redis.register_function('{function}', ")),
                "{function} is not registered"
            );
        }
    }

    #[test]
    fn arguments_follow_the_single_script_contract() {
        let limit: Limit = serde_json::from_str(
            r#"{"algorithm":"leaky_bucket","rate":5,"per":"2s","burst":7,"mode":"shaping","max_wait":"250ms"}"#,
        )
        .unwrap();
        // 5 per 2 s: 400000 us per unit, one tick per microsecond.
        let call = ScriptCall::new(&limit, "k".into(), ScriptTime::Replay(42), 3, true);
        assert_eq!(
            written(&call.args()),
            ["r42", "3", "1", "1", "400000", "1", "7", "250000"]
        );
        let call = ScriptCall::new(&limit, "k".into(), ScriptTime::Redis, 1, false).asking();
        assert_eq!(written(&call.args())[..4], ["", "1", "0", "0"]);
        let call = ScriptCall::new(&limit, "k".into(), ScriptTime::Carried(9), 1, false);
        assert_eq!(written(&call.args())[0], "9");
        assert_eq!(
            call.args()
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            written(&call.args()),
            "displayed as written"
        );
    }

    /// The arguments as they go into the command.
    fn written(args: &[ScriptArg]) -> Vec<String> {
        let cmd = LimitScript::fcall(SCRIPTS.get(Algorithm::Gcra), &[], args);
        cmd.args_iter()
            .skip(3)
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8(bytes.to_vec()).unwrap(),
                other => panic!("not a plain argument: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn arguments_follow_the_batch_script_contract() {
        let window: Limit =
            serde_json::from_str(r#"{"algorithm":"fixed_window","limit":5,"window":"1m"}"#)
                .unwrap();
        let gcra: Limit =
            serde_json::from_str(r#"{"algorithm":"gcra","rate":49,"per":"1s","burst":4}"#).unwrap();
        let at = ScriptTime::Replay(7);
        let batch = BatchCall::new(
            at,
            vec![
                (ScriptCall::new(&window, "a".into(), at, 1, false), false),
                (ScriptCall::new(&gcra, "b".into(), at, 2, true), true),
            ],
        );
        assert_eq!(batch.keys, ["a", "b"]);
        assert_eq!(
            written(&batch.args),
            [
                "r7", "2", // time, checks
                "1", "1", "0", "0", "2", "5", "60000000", // fixed_window
                "6", "2", "1", "1", "3", "1000000", "49", "4", // gcra
            ]
        );
    }

    #[test]
    fn replies_are_checked() {
        let reply = |text: &str| redis::Value::BulkString(text.as_bytes().to_vec());
        assert_eq!(
            decode_reply(&reply("0 10 0 500 -1 0")),
            Ok(Verdict {
                allowed: false,
                limit: 10,
                remaining: 0,
                reset_ms: 500,
                retry_after_ms: None,
                delay_ms: 0
            })
        );
        for bad in [
            reply("1 2 3"),
            reply("1 2 3 4 5 6 7"),
            reply(""),
            reply("2 1 1 1 1 1"),
            reply("1 1 1 1 -1 0"),
            reply("0 -5 0 0 0 0"),
            reply("0 10 0 500 -1 0 "),
            reply("0 10 0 5e2 -1 0"),
            reply("0 10 0 99999999999999999999 -1 0"),
            redis::Value::Array(vec![redis::Value::Int(1); 6]),
            redis::Value::Nil,
        ] {
            assert!(decode_reply(&bad).is_err(), "{bad:?}");
        }
        let batch = BatchCall {
            keys: vec!["a".into(), "b".into()],
            args: Vec::new(),
        };
        let verdicts = batch.decode(&reply("1 5 4 0 0 0 0 3 0 20 20 0")).unwrap();
        assert_eq!(
            verdicts.iter().map(|v| v.allowed).collect::<Vec<_>>(),
            [true, false]
        );
        assert!(batch.decode(&reply("1 5 4 0 0 0")).is_err());
    }
}
