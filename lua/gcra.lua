-- gcra: one string, the theoretical arrival time (us). redis-cell's CL.THROTTLE with
-- max_burst = burst - 1, count = rate, period = per.
-- ARGV[4] rate, ARGV[5] per (us), ARGV[6] burst. Contract: core/src/algorithm/gcra.rs.

local rate = tonumber(ARGV[4])
local per = tonumber(ARGV[5])
local burst = tonumber(ARGV[6])
local interval = per / rate
local tolerance = interval * burst
local now = now_us()

local tat = tonumber(redis.call('GET', key)) or now
local excess = math.max(tat - now, 0)

local function remaining(e)
  return floor_units((tolerance - e) / interval)
end

if cost > burst then
  return {0, burst, remaining(excess), ceil_ms(excess), NEVER, 0}
end

local new_excess = excess + interval * cost
local allowed = new_excess <= tolerance + TIME_EPSILON_US
local kept = excess
if allowed then
  kept = new_excess
elseif count_denied then
  kept = math.min(new_excess, 2 * tolerance)
end

local retry_us = 0
if not allowed then
  retry_us = new_excess - tolerance
end
if cost > 0 and (allowed or count_denied) then
  redis.call('SET', key, now + kept, 'PX', ttl_ms(kept))
end
return {flag(allowed), burst, remaining(kept), ceil_ms(kept), ceil_ms(retry_us), 0}
