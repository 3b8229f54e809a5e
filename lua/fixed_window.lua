-- fixed_window: one counter per window, in a hash {w = window index, n = count}.
-- ARGV[4] limit, ARGV[5] window (us). Contract: core/src/algorithm/fixed_window.rs.

local cap = tonumber(ARGV[4])
local window = tonumber(ARGV[5])
local now = now_us()

local index = math.floor(now / window)
local count = 0
local stored = redis.call('HMGET', key, 'w', 'n')
if stored[1] then
  local w = tonumber(stored[1])
  -- A lagging caller counts into the newest window; an older window is over.
  if w >= index then
    index = w
    count = tonumber(stored[2])
  end
end

local to_window_end = (index + 1) * window - now
local function reset_ms(c)
  if c > 0 then
    return ceil_ms(to_window_end)
  end
  return 0
end

if cost > cap then
  return {0, cap, math.max(0, cap - count), reset_ms(count), NEVER, 0}
end

local allowed = count + cost <= cap
local new_count = count
if allowed or count_denied then
  new_count = count + cost
end
if new_count ~= count then
  redis.call('HSET', key, 'w', index, 'n', new_count)
  redis.call('PEXPIRE', key, ttl_ms(to_window_end))
end

local retry = 0
if not allowed then
  retry = ceil_ms(to_window_end)
end
return {flag(allowed), cap, math.max(0, cap - new_count), reset_ms(new_count), retry, 0}
