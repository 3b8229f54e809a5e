//! The scripts' arguments: checks and lease asks turned into `KEYS` and `ARGV`.

use sluice_core::algorithm::exact::Ticks;
use sluice_core::decimal;
use sluice_core::duration::Millis;
use sluice_core::key::ledger_key;
use sluice_core::limit::{Algorithm, Limit};
use sluice_core::wire::LeaseAsk;

use sluice_core::verdict::Verdict;
use sluice_core::wire::LeaseGrant;

use super::reply::{CHECK_NUMBERS, LEASE_NUMBERS, grant, reply_numbers, verdict};
use super::{BadReply, LimitScript, SCRIPTS};

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

/// An ask's terms as the lease script takes them (`lua/lease.lua`): the algorithm's number,
/// the caps and ttl, the rate holders share, the span, the cap on holders, and the limit's
/// parameters.
fn lease_terms(ask: &LeaseAsk) -> Vec<u64> {
    let params = script_params(&ask.limit);
    // The buckets' over-limit regime is a steady rate, which holders over it share as a pace;
    // windows admit in bursts by design, and are never paced (0 units). A share for a span is
    // of the nominal rate, whatever the algorithm.
    let shared_rate = ask.share_span_ms > 0
        || matches!(
            ask.limit,
            Limit::TokenBucket(_) | Limit::LeakyBucket(_) | Limit::Gcra(_)
        );
    let (units, period) = if shared_rate {
        ask.limit.nominal_rate()
    } else {
        (0, Millis::MIN)
    };
    // Algorithm 0: schedule.lua's grant without a wait, which the fund script takes without
    // the rest of a decision's answer (`scheduled()` in `lua/ledger.lua`).
    let scheduled = match &ask.limit {
        Limit::TokenBucket(_) | Limit::Gcra(_) => true,
        Limit::LeakyBucket(l) => l.mode().max_wait().is_none(),
        Limit::FixedWindow(_) | Limit::SlidingLog(_) | Limit::SlidingWindow(_) => false,
    };
    let algorithm = if scheduled {
        0
    } else {
        ask.limit.algorithm().ordinal() as u64 + 1
    };
    let mut terms = vec![
        algorithm,
        ask.terms.max_units,
        ask.terms.max_outstanding,
        ask.terms.ttl.as_micros().unsigned_abs(),
        units,
        period.as_micros().unsigned_abs(),
        ask.share_span_ms.saturating_mul(1000),
        ask.max_holders,
        params.len() as u64,
    ];
    terms.extend(params);
    terms
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

/// Lease asks of one holder, granted by one call of the lease script (see `lua/lease.lua`),
/// or, when every ask is a quota funding, of the fund script (`lua/fund.lua`), which grants
/// the same for half the work. On a Redis Cluster a call holds the asks of one key only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseCall {
    /// `KEYS`: each ask's state key and ledger key.
    pub keys: Vec<String>,
    /// `ARGV`.
    pub args: Vec<String>,
    /// Each ask's `held`, to tell the holder when the ledger counted fewer.
    pub held: Vec<u64>,
    /// Whether the fund script grants it.
    funding: bool,
}

/// Whether the fund script takes this ask: a quota funding, with a span, holding nothing and
/// giving nothing back (of a holder with no secret).
fn is_funding(ask: &LeaseAsk) -> bool {
    ask.share_span_ms > 0 && ask.held == 0 && ask.returning == 0
}

impl LeaseCall {
    /// The call for `asks` (each with its state key) of `holder` with `secret`, at `time`.
    pub fn new<'a>(
        time: ScriptTime,
        holder: &str,
        secret: &str,
        asks: impl IntoIterator<Item = (&'a LeaseAsk, String)>,
    ) -> LeaseCall {
        let asks: Vec<(&LeaseAsk, String)> = asks.into_iter().collect();
        let funding = secret.is_empty() && asks.iter().all(|(ask, _)| is_funding(ask));
        LeaseCall::with(time, holder, secret, asks, funding)
    }

    /// The call for `asks` by the lease script, whatever they are: what the fund script must
    /// grant the same as.
    pub fn general<'a>(
        time: ScriptTime,
        holder: &str,
        secret: &str,
        asks: impl IntoIterator<Item = (&'a LeaseAsk, String)>,
    ) -> LeaseCall {
        LeaseCall::with(time, holder, secret, asks.into_iter().collect(), false)
    }

    fn with(
        time: ScriptTime,
        holder: &str,
        secret: &str,
        asks: Vec<(&LeaseAsk, String)>,
        funding: bool,
    ) -> LeaseCall {
        // Lease calls are few (most requests are decided from what they grant), so their
        // arguments are strings, the holder's among them; numbers are written as a check's.
        let number = |n: u64| ScriptArg::Number(n).to_string();
        let mut args = vec![ScriptArg::Time(time).to_string(), holder.to_owned()];
        if !funding {
            args.push(secret.to_owned());
        }
        let mut call = LeaseCall {
            keys: Vec::new(),
            args,
            held: Vec::new(),
            funding,
        };
        // Each distinct terms once, the asks naming theirs by number: a quota stream's
        // fundings are many asks of a few rules, and each argument costs Redis and the script.
        let mut terms: Vec<Vec<u64>> = Vec::new();
        let mut per_ask = Vec::new();
        for (ask, state_key) in asks {
            call.held.push(ask.held);
            let these = lease_terms(ask);
            let index = match terms.iter().position(|t| *t == these) {
                Some(index) => index,
                None => {
                    terms.push(these);
                    terms.len() - 1
                }
            };
            if funding {
                per_ask.extend([
                    index as u64 + 1,
                    ask.want,
                    ask.demand_per_ks(),
                    ask.carry_per_k,
                ]);
            } else {
                per_ask.extend([
                    index as u64 + 1,
                    ask.want,
                    ask.held,
                    ask.returning,
                    ask.demand_per_ks(),
                    ask.carry_per_k,
                ]);
            }
            let ledger = ledger_key(&state_key);
            call.keys.extend([state_key, ledger]);
        }
        call.args.push(number(call.held.len() as u64));
        call.args.push(number(terms.len() as u64));
        call.args
            .extend(terms.iter().flatten().chain(&per_ask).copied().map(number));
        call
    }

    /// The lease script, or the fund script.
    pub fn script(&self) -> &'static LimitScript {
        if self.funding {
            SCRIPTS.fund()
        } else {
            SCRIPTS.lease()
        }
    }

    /// Splits the script's reply into one grant per ask, or says which ask named a holder
    /// bound to another secret (the call then wrote nothing).
    pub fn decode(&self, reply: &redis::Value) -> Result<LeaseReply, BadReply> {
        if let redis::Value::BulkString(bytes) = reply
            && let Some(index) = bytes.strip_prefix(b"stranger ")
        {
            return decimal::parse(index)
                .and_then(|i| usize::try_from(i).ok())
                .filter(|&i| i < self.held.len())
                .map(LeaseReply::Stranger)
                .ok_or_else(|| BadReply::of(reply));
        }
        let numbers = reply_numbers(reply, self.held.len(), LEASE_NUMBERS)?;
        numbers
            .chunks_exact(LEASE_NUMBERS)
            .zip(&self.held)
            .map(|(nine, &held)| grant(nine, held).ok_or_else(|| BadReply::of(reply)))
            .collect::<Result<_, _>>()
            .map(LeaseReply::Granted)
    }
}

/// What the lease script answered a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseReply {
    /// A grant per ask, in order.
    Granted(Vec<LeaseGrant>),
    /// The ask at this index (within the call) named a holder whose entry in that key's
    /// ledger was bound by another secret; nothing was written.
    Stranger(usize),
}
