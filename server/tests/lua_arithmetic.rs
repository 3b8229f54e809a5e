//! The prelude's exact arithmetic, in Redis' own Lua, against Rust's `u128`.
//!
//! Lua's numbers are doubles; `muldivmod` must still give `floor(a × b / c)` and the remainder
//! exactly when the product passes 2^53, which the algorithms rely on for windows and periods
//! of days with limits of millions. Random sequences reach that path too rarely to trust them
//! with it, so it is tested here on its own, at the edges and at random.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use redis::Script;
use sluice_harness::RedisServer;

const PRELUDE: &str = include_str!("../../lua/prelude.lua");

/// Below 2^53, where doubles hold every integer.
const EXACT: u64 = 1 << 53;

fn script() -> Script {
    Script::new(&format!(
        "{PRELUDE}\n\
         local out = {{}}\n\
         for i = 1, #ARGV, 3 do\n\
           local q, r = muldivmod(tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]))\n\
           out[#out + 1] = q\n\
           out[#out + 1] = r\n\
           out[#out + 1] = ceil_ms(tonumber(ARGV[i]))\n\
         end\n\
         return out"
    ))
}

/// Runs `cases` through the script and checks each against `u128` arithmetic.
fn check(connection: &mut redis::Connection, cases: &[(u64, u64, u64)]) -> Result<(), String> {
    let script = script();
    let mut invocation = script.prepare_invoke();
    for (a, b, c) in cases {
        invocation.arg(a).arg(b).arg(c);
    }
    let out: Vec<i64> = invocation.invoke(connection).map_err(|e| e.to_string())?;
    for (i, &(a, b, c)) in cases.iter().enumerate() {
        let product = u128::from(a) * u128::from(b);
        let expected = (
            (product / u128::from(c)) as i64,
            (product % u128::from(c)) as i64,
            a.div_ceil(1000) as i64,
        );
        let got = (out[3 * i], out[3 * i + 1], out[3 * i + 2]);
        if got != expected {
            return Err(format!(
                "muldivmod({a}, {b}, {c}) and ceil_ms({a}): Lua {got:?}, exact {expected:?}"
            ));
        }
    }
    Ok(())
}

fn connection(redis: &RedisServer) -> redis::Connection {
    redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap()
}

#[test]
fn muldivmod_is_exact_at_the_edges_of_double_precision() {
    let redis = RedisServer::start().expect("redis-server");
    let mut connection = connection(&redis);
    let two_52 = 1u64 << 52;
    let mut cases = vec![
        (0, 0, 1),
        (1, 1, 1),
        (EXACT - 1, 1, 1),
        (EXACT - 1, 1, 1000),
        (two_52, 1, 3),
        (two_52 - 1, 1, 7),
        (two_52 + 1, 1, 7),
        (1_000_000_000, 2_592_000_000_000, 1_000_000_000),
        (1_000_000_000, 2_592_000_000_000, 999_999_999),
        (999_999_999, 2_591_999_999_999, 2_592_000_000_000),
        (2_000_000_000, 2_592_000_000_000 - 1, 2_592_000_000_000),
        (67_108_865, 67_108_865, 1), // (2^26 + 1)^2, just past 2^52
        (3_037_000_499, 3_037_000_499, 1_024),
    ];
    // Products on both sides of 2^52 and 2^53 with remainders of 0, 1 and c - 1.
    for c in [1u64, 2, 3, 1000, 49, 86_400_000_000, (1 << 50) - 1] {
        for target in [
            u128::from(two_52),
            u128::from(EXACT),
            u128::from(EXACT) * 1000,
            u128::from(EXACT) * u128::from(c.min(1 << 20)),
        ] {
            let a = u64::try_from(target / u128::from(c))
                .unwrap()
                .clamp(1, EXACT - 2);
            for b in [1u64, c, c.saturating_sub(1).max(1)] {
                let product = u128::from(a) * u128::from(b);
                if product / u128::from(c) < u128::from(EXACT) && a < EXACT && b < EXACT {
                    cases.push((a, b, c));
                    cases.push((a + 1, b, c));
                    cases.push((a.saturating_sub(1), b, c));
                }
            }
        }
    }
    check(&mut connection, &cases).unwrap();
}

#[test]
fn muldivmod_is_exact_for_random_operands_whose_quotient_fits() {
    let redis = RedisServer::start().expect("redis-server");
    let connection = std::cell::RefCell::new(connection(&redis));
    // Operands drawn on a log scale, so every magnitude up to 2^53 is as likely as another.
    let operand = |bits: u32| (0u32..=bits, any::<u64>()).prop_map(|(b, r)| r >> (64 - b.max(1)));
    let case = (operand(53), operand(53), operand(50))
        .prop_map(|(a, b, c)| (a, b, c.max(1)))
        .prop_filter("quotient below 2^53", |&(a, b, c)| {
            u128::from(a) * u128::from(b) / u128::from(c) < u128::from(EXACT)
        });
    let mut runner = TestRunner::new(Config {
        cases: 200,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&prop::collection::vec(case, 500), |cases| {
        check(&mut connection.borrow_mut(), &cases).map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
