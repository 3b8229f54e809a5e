-- sluice schedule: virtual scheduling, the one computation behind gcra, token_bucket and
-- leaky_bucket (contract and explanation: core/src/algorithm/schedule.rs). The key holds one
-- time, the theoretical arrival time, as "<us>:<ticks>", or "<us>" when no ticks are left
-- over (Redis then keeps it as an integer, 32 bytes smaller), and after it the key's lease
-- ledger when it has one (cell() in prelude.lua).
--
-- Times are counted in ticks of 1/R microsecond, so that an interval (per / rate) is a whole
-- P ticks: P and R are the limit's parameters reduced by their gcd, computed by sluice-server.
-- A time is a pair (microseconds, ticks) with 0 <= ticks < R; the pair functions below keep
-- both parts exact.

local function pair_add(a, af, b, bf, R)
  local f = af + bf
  if f >= R then
    return a + b + 1, f - R
  end
  return a + b, f
end

local function pair_sub(a, af, b, bf, R)
  local f = af - bf
  if f < 0 then
    return a - b - 1, f + R
  end
  return a - b, f
end

local function pair_lt(a, af, b, bf)
  return a < b or (a == b and af < bf)
end

-- Whole units of P ticks in the pair, floored; 0 if negative.
local function pair_units(a, af, P, R)
  if a < 0 then
    return 0
  end
  local q, r = muldivmod(a, R, P)
  return q + floor_div(r + af, P)
end

-- The whole units that the tolerance (`tol`, `tolf`) leaves past an excess (`e`, `ef`).
local function remaining(tol, tolf, e, ef, P, R)
  local left, leftf = pair_sub(tol, tolf, e, ef, R)
  return pair_units(left, leftf, P, R)
end

-- `units` intervals as a pair.
local function intervals(units, P, R)
  return muldivmod(units, P, R)
end

-- The excess a key holds at `now` (the time it stores past `now`, as a pair; 0 if none).
local function excess(key, now, R)
  local time = cell(key)[1]
  if time ~= '' then
    local us, ticks = fields(key, time, TIME_PATTERN, '<us>[:<ticks>]')
    us = tonumber(us)
    ticks = math.min(tonumber(ticks) or 0, R - 1)
    if pair_lt(now, 0, us, ticks) then
      return us - now, ticks
    end
  end
  return 0, 0
end

-- Stores an excess of (`kept`, `keptf`) past `now`.
local function store(key, now, kept, keptf)
  local tat = string.format('%d', now + kept)
  if keptf > 0 then
    tat = string.format('%d:%d', now + kept, keptf)
  end
  set_cell(key, 1, tat, ttl_ms(kept, keptf))
end

-- A grant without a wait, as schedule(key, now, -want, false, true, P, R, burst, nil, reach)
-- takes it: the units taken, and the units left after (a quota funding needs no more of its
-- answer).
local function grant(key, now, want, P, R, burst, reach)
  local ex, exf = excess(key, now, R)
  local tol = burst * P + reach
  if R == 1 and tol < TWO_52 then
    -- Whole microseconds an interval, every number below 2^53: plain arithmetic is exact
    -- (a quotient of integers below 2^53, rounded, never crosses an integer), and spares a
    -- quota funding on such a limit (nearly all are) a tenth of its instructions.
    local take = math.max(0, math.min(want, math.floor(math.max(tol - ex, 0) / P), burst))
    local kept = ex + take * P
    if take > 0 then
      set_cell(key, 1, string.format('%d', now + kept), ttl_ms(kept))
    end
    return take, math.floor(math.max(tol - kept, 0) / P)
  end
  local tolf
  tol, tolf = intervals(burst, P, R)
  tol = tol + reach
  local take = math.max(0, math.min(want, remaining(tol, tolf, ex, exf, P, R), burst))
  if take > 0 then
    local c, cf = intervals(take, P, R)
    ex, exf = pair_add(ex, exf, c, cf, R)
    store(key, now, ex, exf)
  end
  return take, remaining(tol, tolf, ex, exf, P, R)
end

local function schedule(key, now, cost, count_denied, commit, P, R, burst, max_wait, reach)
  local ex, exf = excess(key, now, R)
  local tol, tolf = intervals(burst, P, R)
  if reach then
    -- What it admits `reach` later: that much more excess tolerated.
    tol = tol + reach
  end

  if cost < 0 then
    cost = math.min(-cost, remaining(tol, tolf, ex, exf, P, R), burst)
  end
  if cost > burst then
    return {0, burst, remaining(tol, tolf, ex, exf, P, R), ceil_ms_frac(ex, exf), NEVER, 0, 0}
  end
  local c, cf = intervals(cost, P, R)
  local new, newf = pair_add(ex, exf, c, cf, R)
  local fits = not pair_lt(tol, tolf, new, newf)
  -- due: the most excess this request may find and still pass
  local due, duef = pair_sub(tol, tolf, c, cf, R)
  local allowed = fits
  if max_wait then
    allowed = fits and not pair_lt(max_wait, 0, ex, exf)
    if pair_lt(max_wait, 0, due, duef) then
      due, duef = max_wait, 0
    end
  end

  local kept, keptf = ex, exf
  if allowed then
    kept, keptf = new, newf
  elseif count_denied then
    local cap, capf = pair_add(tol, tolf, tol, tolf, R)
    if pair_lt(cap, capf, new, newf) then
      new, newf = cap, capf
    end
    if pair_lt(kept, keptf, new, newf) then
      kept, keptf = new, newf
    end
  end

  local retry = 0
  if not allowed then
    retry = ceil_ms_frac(pair_sub(kept, keptf, due, duef, R))
  end
  local delay = 0
  if allowed and max_wait then
    delay = ceil_ms_frac(ex, exf)
  end
  if commit and pair_lt(ex, exf, kept, keptf) then
    store(key, now, kept, keptf)
  end
  return {flag(allowed), burst, remaining(tol, tolf, kept, keptf, P, R),
    ceil_ms_frac(kept, keptf), retry, delay, allowed and cost or 0}
end
