-- sliding_window: the current and previous window's counters, the string
-- "<window index>:<current>:<previous>".
-- p: limit, window (us). Contract: core/src/algorithm/sliding_window.rs.

local cap, w = p[1], p[2]
local index = floor_div(now, w)
local current = 0
local previous = 0
local found, sw, cur, prev = read_fields(key, '^(%d+):(%d+):(%d+)$',
  '<window>:<current>:<previous>')
if found then
  sw = tonumber(sw)
  if index <= sw then
    index = sw
    current = tonumber(cur)
    previous = tonumber(prev)
  elseif index == sw + 1 then
    previous = tonumber(cur)
  end
end

local start = index * w
local elapsed = math.max(0, now - start)
-- The previous window's weighted count, previous x (w - elapsed) / w, rounded up: the
-- estimate plus a whole x is within the limit exactly when weighed + current + x is.
local weighed, rest = muldivmod(previous, w - elapsed, w)
if rest > 0 then
  weighed = weighed + 1
end
local to_next_window = start + w - now
local function reset_ms(cur)
  if cur > 0 then
    return ceil_ms(to_next_window + w)
  elseif previous > 0 then
    return ceil_ms(to_next_window)
  end
  return 0
end

if cost < 0 then
  cost = math.min(-cost, math.max(0, cap - weighed - current))
end
if cost > cap then
  return {0, cap, math.max(0, cap - weighed - current), reset_ms(current), NEVER, 0, 0}
end

local allowed = weighed + current + cost <= cap
local new_current = current
if allowed then
  new_current = current + cost
elseif count_denied then
  new_current = math.max(current, math.min(current + cost, 2 * cap))
end

-- `base` minus `n / d` microseconds, as milliseconds rounded up (0 if not positive).
local function ceil_ms_minus(base, n, d)
  local q, r = muldivmod(n, w, d)
  if r == 0 then
    return ceil_ms(base - q)
  end
  return ceil_ms_frac(base - q - 1, d - r)
end

local retry = 0
if not allowed then
  local room = cap - new_current - cost
  if room >= 0 and previous > 0 then
    -- Within this window, once previous x (w - e) / w <= room.
    retry = ceil_ms_minus(to_next_window, room, previous)
  elseif new_current == 0 then
    retry = ceil_ms(to_next_window)
  elseif cap - cost >= new_current then
    -- In the next window new_current is the previous count, and leaves room at once.
    retry = ceil_ms(to_next_window)
  else
    -- ... or once new_current x (w - e) / w <= limit - cost.
    retry = ceil_ms_minus(to_next_window + w, cap - cost, new_current)
  end
end

if commit and new_current ~= current then
  redis.call('SET', key, string.format('%d:%d:%d', index, new_current, previous),
    'PX', ttl_ms(to_next_window + w))
end
return {flag(allowed), cap, math.max(0, cap - weighed - new_current), reset_ms(new_current), retry, 0,
  allowed and cost or 0}
