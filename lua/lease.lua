-- sluice lease: grant units of keys to one holder (an Envoy) ahead of need, and take back what
-- it gives back. Follows ledger.lua (the ledger, and what an ask is granted).
--
-- ARGV[1]  the time (see clock() in prelude.lua)
-- ARGV[2]  the holder
-- ARGV[3]  the holder's secret ("" for none)
-- ARGV[4]  the number of asks
-- ARGV[5]  the number of terms
-- then per terms (asks of one rule share them; read_terms() in ledger.lua): the algorithm's
-- number (1-6, or 0 for schedule.lua's parameters without a wait), max_units,
-- max_outstanding, ttl (us), the rate holders share as units per period (us; 0 units: not
-- paced), the span (us; 0: none, see ledger.lua), the most holders the ledger may name (0: no
-- cap, see ledger.lua), the number of parameters, the parameters;
-- then per ask: its terms' number (from 1), want, held, returning, demand (units a thousand
-- seconds), carry (thousandths of a unit its span's earlier grants left over; see ledger.lua).
-- KEYS[2i - 1], KEYS[2i]  ask i's state key and ledger key (one hash tag).
--
-- Answers per ask (reply() in prelude.lua): granted, lease_ms, more_in_ms, limit, remaining,
-- pace_us, held (of the units the ask said were held, those the ledger still counted), the
-- share (units a second, times 1000; 0 unless the ask has a span), and 1 if crowded out.

local now = clock(ARGV[1])
local holder = ARGV[2]
local secret = ARGV[3]
local n = tonumber(ARGV[4])
local terms, at = read_terms(ARGV, 6, tonumber(ARGV[5]))
local asks = {}
-- Every ask's state, and its ledger where that is a key of its own, read at once (the states
-- for the algorithms, by read_fields or cell()); every ledger before any is written, so
-- that a call naming a stranger writes nothing. (Asks are for distinct keys, so no ask's
-- writes change another's ledger.)
local reads = {}
for i = 1, n do
  local t = terms[tonumber(ARGV[at])]
  asks[i] = {
    terms = t,
    want = tonumber(ARGV[at + 1]),
    held = tonumber(ARGV[at + 2]),
    returning = tonumber(ARGV[at + 3]),
    demand = tonumber(ARGV[at + 4]),
    carry = tonumber(ARGV[at + 5]),
  }
  reads[#reads + 1] = KEYS[2 * i - 1]
  if not t.in_cell then
    reads[#reads + 1] = KEYS[2 * i]
  end
  at = at + 6
end
prefetch(reads)
local ledgers = {}
for i = 1, n do
  local live, pool, pool_expires = entries(KEYS[2 * i - 1], KEYS[2 * i], asks[i].terms, now)
  if stranger(live, holder, secret) then
    return 'stranger ' .. (i - 1)
  end
  ledgers[i] = {live, pool, pool_expires}
end
local out = {}
for i = 1, n do
  local ask = asks[i]
  local live, pool, pool_expires = unpack(ledgers[i])
  out[i] = lease(KEYS[2 * i - 1], KEYS[2 * i], live, pool, pool_expires, now, holder, secret,
    ask.terms, ask)
end
flush()
return reply(out, LEASE_REPLY)
