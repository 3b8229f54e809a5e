-- sliding_log: a sorted set, one member per admitted unit, scored by its time (us).
-- p: limit, window (us). Contract: core/src/algorithm/sliding_log.rs.

local cap, window = p[1], p[2]

local newest = nil
local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
if last[2] then
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
local count
if commit then
  trimmed = redis.call('ZREMRANGEBYSCORE', key, '-inf', horizon)
  count = redis.call('ZCARD', key)
else
  count = redis.call('ZCOUNT', key, after_horizon, '+inf')
end
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

if cost > cap then
  if commit and trimmed > 0 and count > 0 then
    redis.call('PEXPIRE', key, ttl_ms(until_newest_leaves()))
  end
  return {0, cap, math.max(0, cap - count), ceil_ms(until_newest_leaves()), NEVER, 0}
end

local allowed = count + cost <= cap
local adds = 0
if cost > 0 and (allowed or count_denied) then
  adds = cost
  newest = now
end
-- Counted denials keep the log full while bounding it to 2 x limit entries: the oldest go.
local held = count + adds
local dropped = 0
if not allowed and held > 2 * cap then
  dropped = held - 2 * cap
  held = 2 * cap
end

local retry = 0
if not allowed then
  -- The k-th oldest entry kept must leave for `cost` more to fit. Entries are the live ones,
  -- oldest first, then the ones this request adds at `now`.
  local k = dropped + held + cost - cap
  if k <= count then
    local entry = redis.call('ZRANGE', key, after_horizon, '+inf', 'BYSCORE', 'LIMIT', k - 1, 1,
      'WITHSCORES')
    retry = ceil_ms(tonumber(entry[2]) + window - now)
  else
    retry = ceil_ms(window)
  end
end

if commit then
  if adds > 0 then
    -- Members are <time>:<n>, n one more than the largest already at that microsecond
    -- (zero-padded, so rank order is numeric order), so two requests in one millisecond, or
    -- one microsecond, are two entries, even after counted denials trimmed the oldest.
    local base = 0
    local top = redis.call('ZREVRANGEBYSCORE', key, now, now, 'LIMIT', 0, 1)
    if top[1] then
      base = tonumber(string.sub(top[1], -10)) + 1
    end
    local args = {}
    for i = 0, adds - 1 do
      args[#args + 1] = now
      args[#args + 1] = string.format('%d:%010d', now, base + i)
      if #args >= 2000 then
        redis.call('ZADD', key, unpack(args))
        args = {}
      end
    end
    if #args > 0 then
      redis.call('ZADD', key, unpack(args))
    end
    if dropped > 0 then
      redis.call('ZREMRANGEBYRANK', key, 0, dropped - 1)
    end
  end
  if (trimmed > 0 or adds > 0) and held > 0 then
    redis.call('PEXPIRE', key, ttl_ms(until_newest_leaves()))
  end
end
return {flag(allowed), cap, math.max(0, cap - held), ceil_ms(until_newest_leaves()), retry, 0}
