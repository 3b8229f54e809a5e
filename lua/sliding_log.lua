-- sliding_log: a sorted set, one member per admitted unit, scored by its time (us).
-- ARGV[4] limit, ARGV[5] window (us). Contract: core/src/algorithm/sliding_log.rs.

local cap = tonumber(ARGV[4])
local window = tonumber(ARGV[5])
local now = now_us()

local newest = nil
local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
if last[2] then
  newest = tonumber(last[2])
  if newest > now then
    now = newest
  end
end

-- Trim what has left the window, then count everything left, including entries stamped
-- after this caller's own clock: counting only up to `now` is the classic bug that lets
-- lagging callers over-admit.
local trimmed = redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
local count = redis.call('ZCARD', key)
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

local function refresh_expiry(changed, held)
  if changed and held > 0 then
    redis.call('PEXPIRE', key, ttl_ms(until_newest_leaves()))
  end
end

if cost > cap then
  refresh_expiry(trimmed > 0, count)
  return {0, cap, math.max(0, cap - count), ceil_ms(until_newest_leaves()), NEVER, 0}
end

local allowed = count + cost <= cap
local changed = trimmed > 0
local held = count
if (allowed or count_denied) and cost > 0 then
  -- Members are <time>:<n>, n one more than the largest already at that microsecond
  -- (zero-padded, so rank order is numeric order), so two requests in one millisecond, or
  -- one microsecond, are two entries, even after counted denials trimmed the oldest.
  local base = 0
  local top = redis.call('ZREVRANGEBYSCORE', key, now, now, 'LIMIT', 0, 1)
  if top[1] then
    base = tonumber(string.sub(top[1], -10)) + 1
  end
  local args = {}
  for i = 0, cost - 1 do
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
  held = count + cost
  newest = now
  changed = true
  if not allowed and held > 2 * cap then
    -- Counted denials keep the log full while bounding it to 2 x limit entries.
    redis.call('ZREMRANGEBYRANK', key, 0, held - 2 * cap - 1)
    held = 2 * cap
  end
end

local retry = 0
if not allowed then
  local k = held + cost - cap
  local entry = redis.call('ZRANGE', key, k - 1, k - 1, 'WITHSCORES')
  retry = ceil_ms(tonumber(entry[2]) + window - now)
end
refresh_expiry(changed, held)
return {flag(allowed), cap, math.max(0, cap - held), ceil_ms(until_newest_leaves()), retry, 0}
