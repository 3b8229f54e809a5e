-- sliding_log: a sorted set, one member per admitted unit, scored by its time (us).
-- ARGV[4] limit, ARGV[5] window (us). Contract: core/src/algorithm/sliding_log.rs.

local cap = tonumber(ARGV[4])
local window = tonumber(ARGV[5])
local now = now_us()

local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
if newest[2] then
  local t = tonumber(newest[2])
  if t > now then
    now = t
  end
end

-- Trim what has left the window, then count everything left, including entries stamped
-- after this caller's own clock: counting only up to `now` lets lagging callers over-admit.
local trimmed = redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
local count = redis.call('ZCARD', key)

local function until_newest_leaves()
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then
    return tonumber(last[2]) + window - now
  end
  return 0
end

local function refresh_expiry(changed)
  if changed and redis.call('EXISTS', key) == 1 then
    redis.call('PEXPIRE', key, ttl_ms(until_newest_leaves()))
  end
end

if cost > cap then
  refresh_expiry(trimmed > 0)
  return {0, cap, math.max(0, cap - count), ceil_ms(until_newest_leaves()), NEVER, 0}
end

local allowed = count + cost <= cap
local changed = trimmed > 0
if allowed or count_denied then
  if cost > 0 then
    -- Members are <time>:<n>, n counting the entries already at that microsecond, so two
    -- requests in one millisecond (or microsecond) are two entries.
    local base = redis.call('ZCOUNT', key, now, now)
    local args = {}
    for i = 0, cost - 1 do
      args[#args + 1] = now
      args[#args + 1] = string.format('%d:%d', now, base + i)
      if #args >= 2000 then
        redis.call('ZADD', key, unpack(args))
        args = {}
      end
    end
    if #args > 0 then
      redis.call('ZADD', key, unpack(args))
    end
    changed = true
  end
  if not allowed then
    -- Counted denials keep the log full while bounding it to 2 x limit entries.
    local excess = redis.call('ZCARD', key) - 2 * cap
    if excess > 0 then
      redis.call('ZREMRANGEBYRANK', key, 0, excess - 1)
    end
  end
end

local held = redis.call('ZCARD', key)
local retry = 0
if not allowed then
  local k = held + cost - cap
  local entry = redis.call('ZRANGE', key, k - 1, k - 1, 'WITHSCORES')
  retry = ceil_ms(tonumber(entry[2]) + window - now)
end
refresh_expiry(changed)
return {flag(allowed), cap, math.max(0, cap - held), ceil_ms(until_newest_leaves()), retry, 0}
