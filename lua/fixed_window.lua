-- fixed_window: one counter per window, the string "<window index>:<count>".
-- p: limit, window (us). Contract: core/src/algorithm/fixed_window.rs.

local cap, window = p[1], p[2]
local index = floor_div(now, window)
local count = 0
local found, w, n = read_fields(key, '^(%d+):(%d+)$', '<window>:<count>')
if found then
  w = tonumber(w)
  -- A lagging caller counts into the newest window; an older window is over.
  if w >= index then
    index = w
    count = tonumber(n)
  end
end

local to_window_end = (index + 1) * window - now
local function reset_ms(c)
  if c > 0 then
    return ceil_ms(to_window_end)
  end
  return 0
end

if cost < 0 then
  cost = math.min(-cost, math.max(0, cap - count))
end
if cost > cap then
  return {0, cap, math.max(0, cap - count), reset_ms(count), NEVER, 0, 0}
end

local allowed = count + cost <= cap
local new_count = count
if allowed then
  new_count = count + cost
elseif count_denied then
  new_count = math.max(count, math.min(count + cost, 2 * cap))
end
if commit and new_count ~= count then
  redis.call('SET', key, string.format('%d:%d', index, new_count), 'PX', ttl_ms(to_window_end))
end

local retry = 0
if not allowed then
  retry = ceil_ms(to_window_end)
end
return {flag(allowed), cap, math.max(0, cap - new_count), reset_ms(new_count), retry, 0,
  allowed and cost or 0}
