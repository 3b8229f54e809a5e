-- sluice lease: grant units of keys to one holder (an Envoy) ahead of need, and take back what
-- it gives back. Follows the prelude, schedule.lua and every algorithm's file wrapped as
-- ALGORITHMS[n] (server/src/scripts.rs). Contract and bound: core/src/lease.rs.
--
-- ARGV[1]  the time in microseconds (replay mode only), or "" to read Redis TIME
-- ARGV[2]  the holder
-- ARGV[3]  the number of asks
-- then per ask: the algorithm's number (1-6), want, held, returning, max_units,
-- max_outstanding, ttl (us), the number of parameters, the parameters.
-- KEYS[2i - 1], KEYS[2i]  ask i's state key and ledger key (one hash tag).
--
-- The ledger is a hash: each holder's units, and '#pool' (no holder can be named so) for
-- units given back, each as "<units>:<expires us>". Units given back go to the pool; a grant
-- takes from the pool first, then from the algorithm: the most it admits now, as a request of
-- that cost would consume them. Nothing a holder holds, nor the pool, counts after it expires.
-- Returns per ask: granted, lease_ms, empty_for_ms, limit, remaining.

local POOL = '#pool'

local function entry(ledger, field, value)
  local units, expires = string.match(value, '^(%d+):(%d+)$')
  if not units then
    error({err = 'ERR sluice: ledger ' .. ledger .. ' holds "' .. value .. '" for ' .. field})
  end
  return tonumber(units), tonumber(expires)
end

local function lease(key, ledger, now, holder, run, want, held, returning, max_units, max_total,
                     ttl, p)
  local mine, pool, pool_expires, others = 0, 0, 0, 0
  local stale = {}
  local ledger_entries = redis.call('HGETALL', ledger)
  for i = 1, #ledger_entries, 2 do
    local field = ledger_entries[i]
    local units, expires = entry(ledger, field, ledger_entries[i + 1])
    if expires <= now then
      stale[#stale + 1] = field
    elseif field == holder then
      mine = units
    elseif field == POOL then
      pool, pool_expires = units, expires
    else
      others = others + units
    end
  end
  if #stale > 0 then
    redis.call('HDEL', ledger, unpack(stale))
  end

  -- A holder cannot give back, or keep, more than the ledger says it holds.
  returning = math.min(returning, mine)
  held = math.min(held, mine - returning)
  if returning > 0 then
    pool = pool + returning
    pool_expires = now + ttl
  end
  local wanted = math.max(0, math.min(want, max_units - held))
  local from_pool = math.min(wanted, pool)
  pool = pool - from_pool
  local outstanding = others + pool + held + from_pool
  local fresh = math.max(0, math.min(wanted - from_pool, max_total - outstanding))

  -- The algorithm's answer at cost 0 says how many units it admits now.
  local answer = run(key, now, 0, false, false, p)
  fresh = math.min(fresh, answer[3])
  if fresh > 0 then
    answer = run(key, now, fresh, false, true, p)
  end
  local granted = from_pool + fresh
  local empty_for = 0
  if granted == 0 and wanted > 0 and answer[3] == 0 then
    -- Nothing to lease: how long until a unit is admitted (-1: never, for this limit).
    empty_for = math.max(0, run(key, now, 1, false, false, p)[5])
  end

  mine = held + granted
  if mine > 0 then
    redis.call('HSET', ledger, holder, string.format('%d:%d', mine, now + ttl))
  else
    redis.call('HDEL', ledger, holder)
  end
  if pool > 0 then
    redis.call('HSET', ledger, POOL, string.format('%d:%d', pool, pool_expires))
  elseif returning > 0 or from_pool > 0 then
    redis.call('HDEL', ledger, POOL)
  end
  if mine > 0 or pool > 0 then
    redis.call('PEXPIRE', ledger, ttl_ms(ttl))
  end
  return {granted, ceil_ms(ttl), empty_for, answer[2], answer[3]}
end

local now = clock(ARGV[1])
local holder = ARGV[2]
local n = tonumber(ARGV[3])
local out = {}
local at = 4
for i = 1, n do
  local count = tonumber(ARGV[at + 7])
  local p = {}
  for j = 1, count do
    p[j] = tonumber(ARGV[at + 7 + j])
  end
  local grant = lease(KEYS[2 * i - 1], KEYS[2 * i], now, holder, ALGORITHMS[tonumber(ARGV[at])],
    tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3]),
    tonumber(ARGV[at + 4]), tonumber(ARGV[at + 5]), tonumber(ARGV[at + 6]), p)
  for _, v in ipairs(grant) do
    out[#out + 1] = v
  end
  at = at + 8 + count
end
return out
