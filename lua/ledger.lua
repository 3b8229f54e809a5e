-- sluice ledger: who holds units of a key, and the grant of one lease ask, for the lease
-- and fund scripts. Follows the prelude, schedule.lua and every algorithm's file wrapped as
-- ALGORITHMS[n] (server/src/scripts/mod.rs). Contract and bound: core/src/lease/mod.rs.
--
-- The ledger is a string, one entry per holder, separated by spaces:
--   "<holder>=<units>:<expires us>:<demand per 1000 s>:<secret>"
-- and "#pool=<units>:<expires us>" (no holder can be named so) for units given back. (A string,
-- not a hash: one MGET reads every ask's ledger and state, and one SET with its expiry writes a
-- ledger, where a hash took HGETALL, HSET and PEXPIRE an ask.) A schedule's ledger is kept in
-- its key, after its time (cell() in prelude.lua); any other algorithm's in a key of its own,
-- the ledger key (core/src/key.rs). A holder's entry binds its
-- secret while it lives: an ask naming the holder with another secret could give back or disown
-- units the holder still spends, so a call with such an ask writes nothing and answers
-- "stranger <ask index>". Units given back go to the pool; a grant takes from the pool first,
-- then from the algorithm: the most it admits now, as a request of that cost would consume
-- them. Nothing a holder holds, nor the pool, counts after it expires. When the algorithm
-- cannot give a holder all it wants, the holder is told when the rest will be there; when the
-- holders' demands add up to more than the nominal rate and the algorithm has nothing left,
-- each is told its max-min fair share of the rate, as a pace.
-- An ask with a span (the quota service's, for an Envoy's token bucket) always gets a share of
-- the whole rate: the max-min fair share, with what the holders' demands leave over split
-- evenly among them; it is granted at most that share for the span (plus what its carry
-- makes a whole unit: the share over the span in thousandths, plus the carry, cut to whole
-- units, as share_over_span in core/src/wire/lease.rs), and stays in the ledger
-- while it wants units, even holding none, so that its demand counts in the others' shares.
-- A holder the ledger does not name, asking when it names the most holders its terms allow,
-- is crowded out: it is granted nothing, claims no share, and is told when the first of the
-- others' entries ends; nothing is written.

local POOL = '#pool'
-- An ask's nine numbers in a reply (see lease.lua).
local LEASE_REPLY = '%d %d %d %d %d %d %d %d %d'
-- The furthest ahead an ask with a span reaches (see lease()).
local MAX_REACH_US = 1000000

-- The ledger of state key `key` (ledger key `ledger`) for terms `t`, as stored; nil for none.
local function read_ledger(key, ledger, t)
  if t.in_cell then
    local stored = cell(key)[2]
    if stored == '' then
      return nil
    end
    return stored
  end
  return take(ledger)
end

-- Stores `value` as the ledger of state key `key` (ledger key `ledger`) for terms `t`, to
-- live `ms` milliseconds; a nil `value` removes it.
local function write_ledger(key, ledger, t, value, ms)
  if t.in_cell then
    set_cell(key, 2, value or '', value and ms or 0)
  elseif value then
    redis.call('SET', ledger, value, 'PX', ms)
  else
    redis.call('DEL', ledger)
  end
end

-- The live entries at `now` of the ledger of `key` (ledger key `ledger`) for terms `t`, in
-- order ({holder, units, expires, demand, secret, the entry as written} each), and the pool's
-- units and expiry. An entry of another shape is an error: never guess.
local function entries(key, ledger, t, now)
  local live = {}
  local pool, pool_expires = 0, 0
  local stored = read_ledger(key, ledger, t)
  if not stored then
    return live, pool, pool_expires
  end
  for item in string.gmatch(stored, '[^ ]+') do
    local field, units, expires, demand, secret =
      string.match(item, '^([^=]+)=(%d+):(%d+):?(%d*):?([%w_-]*)$')
    if not field then
      local where = ledger
      if t.in_cell then
        where = 'in ' .. key
      end
      error({err = 'ERR sluice: ledger ' .. where .. ' holds "' .. item .. '"'})
    end
    expires = tonumber(expires)
    if expires > now then
      if field == POOL then
        pool, pool_expires = tonumber(units), expires
      else
        live[#live + 1] = {field, tonumber(units), expires, tonumber(demand) or 0, secret, item}
      end
    end
  end
  return live, pool, pool_expires
end

-- Whether `holder` has a live entry among `live` that another secret bound.
local function stranger(live, holder, secret)
  for _, e in ipairs(live) do
    if e[1] == holder then
      return e[5] ~= secret
    end
  end
  return false
end

-- The max-min fair share of `capacity` among `demands` of the demand at index `own`: the
-- smallest demands are met in full, the rest share what is left evenly.
local function fair_share(demands, own, capacity, spread)
  if #demands == 1 then
    -- Alone: all of its demand, and with `spread` all of the capacity.
    if spread then
      return capacity
    end
    return math.min(demands[1], capacity)
  end
  local order = {}
  for i = 1, #demands do
    order[i] = i
  end
  table.sort(order, function(a, b)
    return demands[a] < demands[b]
  end)
  local left = capacity
  local given = {}
  for k, i in ipairs(order) do
    given[i] = math.min(demands[i], left / (#demands - k + 1))
    left = left - given[i]
  end
  if spread then
    return given[own] + left / #demands
  end
  return given[own]
end

local function lease(key, ledger, live, pool, pool_expires, now, holder, secret, terms, ask)
  local want, held, returning = ask.want, ask.held, ask.returning
  local max_units, max_total, ttl = terms.max_units, terms.max_total, terms.ttl
  local run, p = terms.run, terms.p
  local mine, others = 0, 0
  -- The holder's own entry, as the ledger keeps it.
  local own
  -- When the last of the other holders' leases ends: holders may lease a key on different
  -- terms (a rollout that changes the ttl), and the ledger must outlive every lease in it.
  local others_expire = now
  -- Demands are kept in units a thousand seconds; shares are units a second.
  local demands = {ask.demand / 1000}
  -- The other holders' entries, as the ledger keeps them.
  local kept = {}
  for _, e in ipairs(live) do
    if e[1] == holder then
      mine = e[2]
      own = e
    else
      others = others + e[2]
      others_expire = math.max(others_expire, e[3])
      demands[#demands + 1] = e[4] / 1000
      kept[#kept + 1] = e[6]
    end
  end
  if not own and terms.max_holders > 0 and #kept >= terms.max_holders then
    local first_ends = others_expire
    for _, e in ipairs(live) do
      first_ends = math.min(first_ends, e[3])
    end
    local peek = run(key, now, 0, false, false, p)
    return {0, 0, ceil_ms(first_ends - now), peek[2], peek[3], 0, 0, 0, 1}
  end

  -- A holder cannot give back, or keep, more than the ledger says it holds.
  returning = math.min(returning, mine)
  held = math.min(held, mine - returning)
  if returning > 0 then
    pool = pool + returning
    pool_expires = now + ttl
  end
  -- The holders' demands, and this holder's share of the rate when they are over it (or
  -- always, with a span).
  local capacity = terms.capacity
  local spread = terms.span > 0
  local total = 0
  for _, d in ipairs(demands) do
    total = total + d
  end
  local share = 0
  if capacity > 0 and (spread or total > capacity) then
    share = fair_share(demands, 1, capacity, spread)
  end
  local wanted = math.max(0, math.min(want, max_units - held))
  local share_milli = 0
  if spread then
    share_milli = math.floor(share * 1000)
    local thousandths = math.floor(share_milli * terms.span / 1000000) + ask.carry
    wanted = math.min(wanted, math.floor(thousandths / 1000))
  end
  local from_pool = math.min(wanted, pool)
  pool = pool - from_pool
  local outstanding = others + pool + held + from_pool
  local fresh = math.max(0, math.min(wanted - from_pool, max_total - outstanding))

  -- The most the algorithm admits now, up to `fresh`, as a request of that cost would take it.
  -- An ask with a span reaches half a span ahead, at most a second: holders whose shares add
  -- up to the whole rate find a bucket at its edge each span (what a funding takes was made up
  -- since the last), so a funding that comes earlier after the last than a span, as a busy
  -- server's do by a few hundred milliseconds, would find units short. (What a grant so takes
  -- is what the algorithm admits within half a span, which the bound allows:
  -- docs/algorithms.md.)
  local reach = nil
  if spread then
    reach = terms.reach
  end
  local answer
  if fresh > 0 then
    answer = run(key, now, -fresh, false, true, p, reach)
    fresh = answer[7]
  else
    answer = run(key, now, 0, false, false, p)
  end
  local granted = from_pool + fresh
  local more_in = 0
  if granted < wanted and answer[3] == 0 and not spread then
    -- The algorithm admits no more now: say when it will have the rest, so that the holder
    -- does not ask again before (asking every few milliseconds on a busy key only polls).
    -- (An ask with a span is funded again at its next step whatever the answer.)
    more_in = run(key, now, wanted - granted, false, false, p)[5]
    if more_in < 0 then
      more_in = math.max(0, run(key, now, 1, false, false, p)[5])
    end
  end
  -- When the holders together ask for more than the nominal rate and the algorithm has not a
  -- whole unit left, the key is at its limit: each holder spends at its fair share of the
  -- rate, so that the holders together admit as evenly as the algorithm does, not in a bunch
  -- after each grant. While a burst holds more, the algorithm admits at the pace requests
  -- come, and so do the holders: pacing them then would deny what it admits. (An ask with a
  -- span is granted its share whatever the burst holds: its pace says that share.)
  local pace = 0
  if share > 0 and total > capacity and (spread or answer[3] < 1) then
    pace = math.ceil(1000000 / share)
  end

  mine = held + granted
  -- A holder with a span stays while it wants units: its demand is its claim to a share.
  local stays = mine > 0 or (spread and ask.demand > 0)
  -- An ask with a span claims a share by its demand, and holds units only for the refill it
  -- pays (no cap counts them): while its entry would say the same, and lives at least half
  -- its ttl on, the ledger is left as it is, which spares a busy bucket's funding the write.
  local unchanged = spread and own and stays and own[2] == mine and own[4] == ask.demand
    and own[5] == secret and own[3] >= now + ttl / 2 and returning == 0 and from_pool == 0
  if not unchanged then
    if stays then
      kept[#kept + 1] = string.format('%s=%d:%d:%d:%s', holder, mine, now + ttl, ask.demand,
        secret)
    end
    if pool > 0 then
      kept[#kept + 1] = string.format('%s=%d:%d', POOL, pool, pool_expires)
    end
    if #kept > 0 then
      local last = others_expire
      if stays then
        last = math.max(last, now + ttl)
      end
      if pool > 0 then
        last = math.max(last, pool_expires)
      end
      write_ledger(key, ledger, terms, table.concat(kept, ' '), ttl_ms(last - now))
    elseif #live > 0 or pool_expires > 0 then
      write_ledger(key, ledger, terms, nil)
    end
  end
  return {granted, ceil_ms(ttl), more_in, answer[2], answer[3], pace, held, share_milli, 0}
end


-- A grant of schedule.lua's parameters without a wait: what gcra, token_bucket and a metering
-- leaky_bucket run (the terms' algorithm 0, which the fund script grants without the rest of
-- schedule()'s answer).
local function scheduled(key, now, cost, count_denied, commit, p, reach)
  return schedule(key, now, cost, count_denied, commit, p[1], p[2], p[3], nil, reach)
end

-- `count` terms read from `args` (a call's ARGV) at `at`, each: the algorithm's number
-- (ALGORITHMS order, or 0 for scheduled()), max_units, max_outstanding, ttl (us), the rate
-- holders share as units per period (us), the span (us), the most holders the ledger may
-- name, the number of parameters, the parameters. Answers them, and where `args` goes on.
local function read_terms(args, at, count)
  local terms = {}
  for t = 1, count do
    local params = tonumber(args[at + 8])
    local p = read_params(args, at + 8, params)
    local algorithm = tonumber(args[at])
    local units, period = tonumber(args[at + 4]), tonumber(args[at + 5])
    local span = tonumber(args[at + 6])
    terms[t] = {
      run = ALGORITHMS[algorithm] or scheduled,
      -- Granted by grant() in schedule.lua, without the rest of a decision's answer.
      by_schedule = algorithm == 0,
      -- A schedule: the ledger is kept in the state's key (read_ledger()).
      in_cell = algorithm == 0 or SCHEDULES[algorithm] == true,
      max_units = tonumber(args[at + 1]),
      max_total = tonumber(args[at + 2]),
      ttl = tonumber(args[at + 3]),
      -- The holders' shared rate, units a second.
      capacity = units * 1000000 / period,
      span = span,
      -- How far ahead a funding reaches (see lease()).
      reach = math.min(math.floor(span / 2), MAX_REACH_US),
      max_holders = tonumber(args[at + 7]),
      p = p,
    }
    at = at + 9 + params
  end
  return terms, at
end
