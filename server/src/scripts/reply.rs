//! The scripts' replies, read without trusting them: numbers back into verdicts and grants,
//! anything else refused.

use sluice_core::decimal;
use sluice_core::verdict::Verdict;
use sluice_core::wire::LeaseGrant;

/// A reply that is not what the scripts answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unexpected script reply {reply}: expected a string of integers, six a check (allowed, limit, remaining, reset_ms, retry_after_ms, delay_ms) or nine a lease ask (granted, lease_ms, more_in_ms, limit, remaining, pace_us, held, share_per_ks, crowded)"
)]
#[non_exhaustive]
pub struct BadReply {
    /// The reply, as Redis sent it (a string quoted).
    pub reply: String,
}

impl BadReply {
    pub(super) fn of(reply: &redis::Value) -> BadReply {
        let reply = match reply {
            redis::Value::BulkString(bytes) => format!("{:?}", String::from_utf8_lossy(bytes)),
            other => format!("{other:?}"),
        };
        BadReply { reply }
    }
}

/// The numbers of a check in a script's reply.
pub(super) const CHECK_NUMBERS: usize = 6;
/// The numbers of a lease ask in a script's reply.
pub(super) const LEASE_NUMBERS: usize = 9;

/// The integers of a script's reply to `entries` checks or lease asks of `width` numbers
/// each: one string, the numbers separated by spaces (`reply` in `lua/prelude.lua`).
pub(super) fn reply_numbers(
    reply: &redis::Value,
    entries: usize,
    width: usize,
) -> Result<Vec<i64>, BadReply> {
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

/// A lease ask's nine numbers as its grant, for an ask that said `asked_held` units were
/// held; `None` if they cannot be one.
pub(super) fn grant(nine: &[i64], asked_held: u64) -> Option<LeaseGrant> {
    let &[
        granted,
        lease_ms,
        more_in_ms,
        limit,
        remaining,
        pace_us,
        held,
        share_per_ks,
        crowded,
    ] = nine
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
        share_per_ks: non_negative(share_per_ks)?,
        crowded: match crowded {
            0 => false,
            1 => true,
            _ => return None,
        },
    })
}

pub(super) fn non_negative(v: i64) -> Option<u64> {
    u64::try_from(v).ok()
}

/// A check's six numbers as a verdict; `None` if they cannot be one.
pub(super) fn verdict(six: &[i64]) -> Option<Verdict> {
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
