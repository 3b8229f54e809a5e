//! The Lua scripts, the only code sluice ever runs in Redis.
//!
//! Each algorithm's script is `lua/prelude.lua`, `lua/frame.lua` and that algorithm's file,
//! compiled in, with its SHA computed once. The batch script decides every check of a request
//! in one call: the prelude, each algorithm's file wrapped in the frame as a function, and
//! `lua/batch.lua`. This module alone knows the scripts' arguments and replies: [`ScriptCall`]
//! and [`BatchCall`] turn checks into `KEYS`/`ARGV`, and [`decode_reply`] turns six numbers
//! back into a [`Verdict`], refusing anything else.

use std::sync::LazyLock;

use redis::Script;
use sluice_core::limit::{Algorithm, LeakMode, Limit};
use sluice_core::verdict::Verdict;

const PRELUDE: &str = include_str!("../../lua/prelude.lua");
const FRAME: &str = include_str!("../../lua/frame.lua");
const BATCH: &str = include_str!("../../lua/batch.lua");

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

/// Every algorithm's script, and the batch script.
pub struct Scripts {
    /// By [`Algorithm::ordinal`].
    singles: Vec<Script>,
    batch: Script,
}

/// The scripts, composed once per process.
pub static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| {
    let singles = ALGORITHM_FILES
        .iter()
        .map(|(_, body)| Script::new(&format!("{PRELUDE}\n{FRAME}\n{body}")))
        .collect();
    let mut batch = format!("{PRELUDE}\nlocal ALGORITHMS = {{}}\n");
    for (algorithm, body) in ALGORITHM_FILES {
        batch.push_str(&format!(
            "-- {algorithm}\nALGORITHMS[{}] = function(KEYS, ARGV)\n{FRAME}\n{body}\nend\n",
            algorithm.ordinal() + 1
        ));
    }
    batch.push_str(BATCH);
    Scripts {
        singles,
        batch: Script::new(&batch),
    }
});

impl Scripts {
    /// The script of `algorithm`.
    pub fn get(&self, algorithm: Algorithm) -> &Script {
        &self.singles[algorithm.ordinal()]
    }

    /// The batch script.
    pub fn batch(&self) -> &Script {
        &self.batch
    }

    /// Every script with its algorithm.
    pub fn all(&self) -> impl Iterator<Item = (Algorithm, &Script)> {
        Algorithm::ALL.into_iter().map(|a| (a, self.get(a)))
    }
}

/// One script invocation: the key and the arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptCall {
    /// The algorithm, which picks the script.
    pub algorithm: Algorithm,
    /// `KEYS[1]`.
    pub key: String,
    /// `ARGV`.
    pub args: Vec<String>,
}

impl ScriptCall {
    /// The call deciding `cost` units of `limit` for `redis_key`, at `now_us` when replaying
    /// (otherwise the script reads Redis `TIME`).
    pub fn new(
        limit: &Limit,
        redis_key: String,
        now_us: Option<i64>,
        cost: u64,
        count_denied: bool,
    ) -> ScriptCall {
        let mut args = vec![
            now_us.map(|t| t.to_string()).unwrap_or_default(),
            cost.to_string(),
            if count_denied { "1" } else { "0" }.to_owned(),
        ];
        match limit {
            Limit::FixedWindow(w) | Limit::SlidingLog(w) | Limit::SlidingWindow(w) => {
                args.push(w.limit().to_string());
                args.push(w.window().as_micros().to_string());
            }
            Limit::TokenBucket(b) | Limit::Gcra(b) => {
                args.push(b.rate().to_string());
                args.push(b.per().as_micros().to_string());
                args.push(b.burst().to_string());
            }
            Limit::LeakyBucket(l) => {
                args.push(l.bucket().rate().to_string());
                args.push(l.bucket().per().as_micros().to_string());
                args.push(l.bucket().burst().to_string());
                if let LeakMode::Shaping { max_wait } = l.mode() {
                    args.push(max_wait.as_micros().to_string());
                }
            }
        }
        ScriptCall {
            algorithm: limit.algorithm(),
            key: redis_key,
            args,
        }
    }

    /// The script to run.
    pub fn script(&self) -> &'static Script {
        SCRIPTS.get(self.algorithm)
    }

    /// The same call at cost 0: it only looks (the request was denied by an earlier check).
    pub fn looking(mut self) -> ScriptCall {
        self.args[1] = "0".to_owned();
        self
    }
}

/// Several checks decided by one call of the batch script, in order: once an enforced check is
/// denied, the checks after it only look (cost 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchCall {
    /// `KEYS`: each check's key.
    pub keys: Vec<String>,
    /// `ARGV`.
    pub args: Vec<String>,
}

impl BatchCall {
    /// A batch of `(call, shadow)`, in order.
    pub fn new(calls: Vec<(ScriptCall, bool)>) -> BatchCall {
        let mut args =
            Vec::with_capacity(1 + calls.iter().map(|(c, _)| 3 + c.args.len()).sum::<usize>());
        args.push(calls.len().to_string());
        let mut keys = Vec::with_capacity(calls.len());
        for (call, shadow) in calls {
            args.push((call.algorithm.ordinal() + 1).to_string());
            args.push(if shadow { "1" } else { "0" }.to_owned());
            args.push(call.args.len().to_string());
            args.extend(call.args);
            keys.push(call.key);
        }
        BatchCall { keys, args }
    }

    /// The batch script.
    pub fn script(&self) -> &'static Script {
        SCRIPTS.batch()
    }

    /// Splits the batch script's reply into one verdict per check.
    pub fn decode(&self, reply: Vec<i64>) -> Result<Vec<Verdict>, BadReply> {
        if reply.len() != 6 * self.keys.len() {
            return Err(BadReply(reply));
        }
        reply
            .chunks(6)
            .map(|six| decode_reply(six.to_vec()))
            .collect()
    }
}

/// A reply that is not what the scripts return.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unexpected script reply {0:?}: expected [allowed, limit, remaining, reset_ms, retry_after_ms, delay_ms]"
)]
pub struct BadReply(pub Vec<i64>);

/// Turns a script's six numbers into a verdict.
pub fn decode_reply(reply: Vec<i64>) -> Result<Verdict, BadReply> {
    let [
        allowed,
        limit,
        remaining,
        reset_ms,
        retry_after_ms,
        delay_ms,
    ] = reply[..]
    else {
        return Err(BadReply(reply));
    };
    let non_negative = |v: i64| u64::try_from(v).ok();
    let verdict = (|| {
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
    })();
    verdict.ok_or(BadReply(reply))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_algorithm_has_its_own_script() {
        let hashes: std::collections::HashSet<&str> =
            SCRIPTS.all().map(|(_, s)| s.get_hash()).collect();
        assert_eq!(hashes.len(), 6);
    }

    #[test]
    fn arguments_follow_the_prelude_contract() {
        let limit: Limit = serde_json::from_str(
            r#"{"algorithm":"leaky_bucket","rate":5,"per":"2s","burst":7,"mode":"shaping","max_wait":"250ms"}"#,
        )
        .unwrap();
        let call = ScriptCall::new(&limit, "k".into(), Some(42), 3, true);
        assert_eq!(call.args, ["42", "3", "1", "5", "2000000", "7", "250000"]);
        let call = ScriptCall::new(&limit, "k".into(), None, 1, false);
        assert_eq!(call.args[..3], ["", "1", "0"]);
    }

    #[test]
    fn replies_are_checked() {
        assert_eq!(
            decode_reply(vec![0, 10, 0, 500, -1, 0]),
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
            vec![1, 2, 3],
            vec![2, 1, 1, 1, 1, 1],
            vec![1, 1, 1, 1, -1, 0],
            vec![0, -5, 0, 0, 0, 0],
        ] {
            assert!(decode_reply(bad.clone()).is_err(), "{bad:?}");
        }
    }
}
