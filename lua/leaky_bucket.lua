-- leaky_bucket: a hash {level, ts}; an absent key is an empty bucket.
-- ARGV[4] rate, ARGV[5] per (us), ARGV[6] burst, ARGV[7] max wait (us; absent: meter mode).
-- Contract: core/src/algorithm/leaky_bucket.rs.

local rate = tonumber(ARGV[4])
local per = tonumber(ARGV[5])
local burst = tonumber(ARGV[6])
local max_wait = tonumber(ARGV[7])
local now = now_us()

local level = 0
local ts = now
local stored = redis.call('HMGET', key, 'level', 'ts')
if stored[1] then
  level = tonumber(stored[1])
  ts = tonumber(stored[2])
end
local elapsed = math.max(0, now - ts)
level = math.max(0, level - elapsed * rate / per)
ts = math.max(ts, now)

local function drain_time(l)
  return l * per / rate
end

if cost > burst then
  return {0, burst, floor_units(burst - level), ceil_ms(drain_time(level)), NEVER, 0}
end

local fits = level + cost <= burst + AMOUNT_EPSILON
local wait_us = drain_time(level)
local allowed = fits
local delay_us = 0
if max_wait then
  -- Shaping: the water already in the bucket leaves first.
  allowed = fits and wait_us <= max_wait
  if allowed then
    delay_us = wait_us
  end
end

local new_level = level
if allowed then
  new_level = level + cost
elseif count_denied then
  new_level = math.min(2 * burst, level + cost)
end

local retry_us = 0
if not allowed then
  local target = burst - cost
  if max_wait then
    target = math.min(burst - cost, max_wait * rate / per)
  end
  retry_us = drain_time(new_level - target)
end
if cost > 0 and (allowed or count_denied) then
  redis.call('HSET', key, 'level', new_level, 'ts', ts)
  redis.call('PEXPIRE', key, ttl_ms(drain_time(new_level)))
end
return {flag(allowed), burst, floor_units(burst - new_level), ceil_ms(drain_time(new_level)),
  ceil_ms(retry_us), ceil_ms(delay_us)}
