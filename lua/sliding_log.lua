-- sliding_log: a sorted set, one member per admitted request, scored by its time (us).
-- p: limit, window (us). Contract: core/src/algorithm/sliding_log.rs.
--
-- A member is "<end>/<units>": the request's units, and the log's running total of units up to
-- and including it, zero-padded to 16 digits so that members of one microsecond sort (by name)
-- in the order they came. So one request is one member whatever its cost, the units in the window
-- are the newest member's end less the base of the oldest one in the window, and the entry
-- holding the k-th oldest unit is found by a binary search on rank: a call costs O(log n)
-- commands and adds at most one member, whatever its cost (docs/redis.md, worst case).

local cap, window = p[1], p[2]

local function parse(member)
  local e, u = string.match(member, '^(%d+)/(%d+)$')
  if not e then
    error({err = 'ERR sluice: key ' .. key .. ' holds member "' .. member .. '", not <end>/<units>'})
  end
  return tonumber(e), tonumber(u)
end

local newest = nil
local last_end = 0
local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
if last[2] then
  last_end = parse(last[1])
  newest = tonumber(last[2])
  if newest > now then
    now = newest
  end
end

-- Entries at or before the horizon have left the window. Everything after it is counted,
-- including entries stamped after this caller's own clock: counting only up to `now` is the
-- classic bug that lets lagging callers over-admit.
local horizon = now - window
local after_horizon = string.format('(%d', horizon)
local trimmed = 0
-- The rank of the oldest entry in the window.
local first_rank = 0
if commit then
  trimmed = redis.call('ZREMRANGEBYSCORE', key, '-inf', horizon)
else
  first_rank = redis.call('ZCOUNT', key, '-inf', horizon)
end
-- The running total before the oldest unit in the window.
local base = last_end
local first = redis.call('ZRANGE', key, first_rank, first_rank)
if first[1] then
  local e, u = parse(first[1])
  base = e - u
end
local count = last_end - base
if count == 0 then
  newest = nil
end

-- Until the newest entry leaves the window (the key's lifetime, and `reset`).
local function until_newest_leaves()
  if newest then
    return newest + window - now
  end
  return 0
end

-- The rank of the oldest entry from `first_rank` on whose end reaches `total` (one does).
local function rank_reaching(total)
  local lo, hi = first_rank, redis.call('ZCARD', key) - 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if parse(redis.call('ZRANGE', key, mid, mid)[1]) >= total then
      hi = mid
    else
      lo = mid + 1
    end
  end
  return lo
end

if cost < 0 then
  cost = math.min(-cost, math.max(0, cap - count))
end
if cost > cap then
  if commit and trimmed > 0 and count > 0 then
    redis.call('PEXPIRE', key, ttl_ms(until_newest_leaves()))
  end
  return {0, cap, math.max(0, cap - count), ceil_ms(until_newest_leaves()), NEVER, 0, 0}
end

local allowed = count + cost <= cap
local adds = 0
if cost > 0 and (allowed or count_denied) then
  adds = cost
  newest = now
end
-- Counted denials keep the log full while bounding it to 2 x limit units: the oldest go.
-- (As cost <= limit, they all come from entries older than this request's.)
local held = count + adds
local dropped = 0
if not allowed and held > 2 * cap then
  dropped = held - 2 * cap
  held = 2 * cap
end

local retry = 0
if not allowed then
  -- The entry holding the k-th oldest unit kept must leave for `cost` more to fit. Units are
  -- the live ones, oldest first, then the ones this request adds at `now`.
  local k = dropped + held + cost - cap
  if k <= count then
    local at = rank_reaching(base + k)
    local entry = redis.call('ZRANGE', key, at, at, 'WITHSCORES')
    retry = ceil_ms(tonumber(entry[2]) + window - now)
  else
    retry = ceil_ms(window)
  end
end

if commit then
  if dropped > 0 then
    -- Whole entries up to the dropped units' end go; the one they end inside keeps the rest.
    local cut = base + dropped
    local at = rank_reaching(cut)
    local entry = redis.call('ZRANGE', key, at, at, 'WITHSCORES')
    local e, u = parse(entry[1])
    local through = at - 1
    if e == cut then
      through = at
    end
    if through >= 0 then
      redis.call('ZREMRANGEBYRANK', key, 0, through)
    end
    if e > cut and e - u < cut then
      redis.call('ZREM', key, entry[1])
      redis.call('ZADD', key, entry[2], string.format('%016d/%d', e, e - cut))
    end
  end
  if adds > 0 then
    redis.call('ZADD', key, now, string.format('%016d/%d', last_end + adds, adds))
  end
  if (trimmed > 0 or adds > 0) and held > 0 then
    redis.call('PEXPIRE', key, ttl_ms(until_newest_leaves()))
  end
end
return {flag(allowed), cap, math.max(0, cap - held), ceil_ms(until_newest_leaves()), retry, 0,
  allowed and cost or 0}
