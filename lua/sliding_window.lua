-- sliding_window: the current and previous window's counters, in a hash {w, cur, prev}.
-- ARGV[4] limit, ARGV[5] window (us). Contract: core/src/algorithm/sliding_window.rs.

local cap = tonumber(ARGV[4])
local w = tonumber(ARGV[5])
local now = now_us()

local index = math.floor(now / w)
local current = 0
local previous = 0
local stored = redis.call('HMGET', key, 'w', 'cur', 'prev')
if stored[1] then
  local sw = tonumber(stored[1])
  if index <= sw then
    index = sw
    current = tonumber(stored[2])
    previous = tonumber(stored[3])
  elseif index == sw + 1 then
    previous = tonumber(stored[2])
  end
end

local elapsed = math.max(0, now - index * w)
local weight = (w - elapsed) / w
local function estimate(cur)
  return previous * weight + cur
end
local function reset_us(cur)
  if cur > 0 then
    return (index + 2) * w - now
  elseif previous > 0 then
    return (index + 1) * w - now
  end
  return 0
end

if cost > cap then
  return {0, cap, floor_units(cap - estimate(current)), ceil_ms(reset_us(current)), NEVER, 0}
end

local allowed = estimate(current) + cost <= cap + AMOUNT_EPSILON
local new_current = current
if allowed or count_denied then
  new_current = current + cost
end

local retry_us = 0
if not allowed then
  local cur = new_current
  local room = cap - cur - cost
  local at
  if room >= 0 and previous > 0 then
    at = index * w + (w - room * w / previous)
  else
    room = cap - cost
    local next_start = (index + 1) * w
    if new_current == 0 then
      at = next_start
    else
      at = next_start + math.max(0, w - room * w / cur)
    end
  end
  retry_us = math.max(0, at - now)
end

if new_current ~= current then
  redis.call('HSET', key, 'w', index, 'cur', new_current, 'prev', previous)
  redis.call('PEXPIRE', key, ttl_ms((index + 2) * w - now))
end
return {flag(allowed), cap, floor_units(cap - estimate(new_current)), ceil_ms(reset_us(new_current)),
  ceil_ms(retry_us), 0}
