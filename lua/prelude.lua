-- sluice prelude: constants and pure helpers shared by every limit script. sluice-server
-- composes each algorithm's script as prelude + schedule.lua + that algorithm's file wrapped
-- as the function `run` + single.lua, and the batch script as prelude + schedule.lua + every
-- algorithm's file wrapped + batch.lua (server/src/scripts/mod.rs), so that each algorithm file is
-- that algorithm and nothing else.
--
-- An algorithm's file is the body of a function (key, now, cost, count_denied, commit, p),
-- `p` its parameters as numbers, returning {allowed (0|1), limit, remaining, reset_ms,
-- retry_after_ms, delay_ms, taken}, with retry_after_ms = -1 for a request that can never
-- pass, and `taken` the units it admitted (cost, or 0). With `commit` false it only asks: it
-- decides the same way and writes nothing. A negative cost asks for as many units as the
-- algorithm admits now, up to -cost, in one call (a lease's grant): `taken` says how many.
-- A bucket (schedule.lua) takes one more argument, `reach` in microseconds: it then admits
-- what it would admit that much later, as far as its burst allows (a quota stream's funding).
--
-- Exact arithmetic. Lua's numbers are doubles, exact for integers below 2^53 (9.0e15). Times
-- are microseconds (1.8e15 today), and every answer is the floor or the ceiling of a rational
-- number, so the scripts never take one of a rounded value: they compute with integers below
-- 2^53, times relative to `now` wherever a floor or a ceiling is taken, fractions of a
-- microsecond as whole numerators, and `muldivmod` where a product could pass 2^53. The
-- results equal those of the models in core/src/algorithm/ to the unit.

-- A replay's clock is virtual while expiry runs on Redis' own clock: a key must not vanish
-- (in real time) while the replay still needs it, so replayed keys live at least an hour.
local REPLAY_MIN_TTL_MS = 3600000
local NEVER = -1
local TWO_52 = 4503599627370496
-- Dekker's splitter, 2^27 + 1: splits a double into two halves whose products are exact.
local SPLITTER = 134217729

-- Whether the time came from the caller (replay mode); set by clock().
local replay = false

-- Keys' values a script read ahead with one MGET (see prefetch()), each taken once by
-- read_fields. clock(), which every script calls first, empties it: a library's definitions
-- outlive a call, and one that failed must leave nothing for the next.
local prefetched = {}

-- The time of this call, set by clock().
local call_now = 0

-- The keys of schedules (gcra, token_bucket, leaky_bucket) as this call read and wrote them:
-- see cell(). Emptied by clock(), as `prefetched` is.
local cells = {}
-- The cells this call wrote, in order, for flush().
local written_cells = {}

-- The time of this call in microseconds, from its time argument (server/src/scripts/mod.rs,
-- ScriptTime): "" to read Redis' TIME here; "r" and a number, a replay's virtual time; a
-- number alone, Redis' clock as the server carries it between its reads of TIME, which spares
-- each call the TIME command.
local function clock(arg)
  prefetched = {}
  cells = {}
  written_cells = {}
  if arg == '' then
    replay = false
    local t = redis.call('TIME')
    call_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    return call_now
  end
  replay = string.byte(arg, 1) == 114
  local us
  if replay then
    us = tonumber(string.sub(arg, 2))
  else
    us = tonumber(arg)
  end
  if not us or us < 0 or us ~= math.floor(us) then
    error('sluice: the time argument "' .. arg .. '" is not "", r<us> or <us>')
  end
  call_now = us
  return us
end

-- a * b as p + e, exactly: p the rounded product, e what the rounding lost (Dekker).
local function two_product(a, b)
  local p = a * b
  local t = SPLITTER * a
  local ah = t - (t - a)
  local al = a - ah
  t = SPLITTER * b
  local bh = t - (t - b)
  local bl = b - bh
  return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl
end

-- floor(a * b / c) and the remainder, exactly, for whole a, b >= 0 below 2^53 and
-- 0 < c < 2^50, when the quotient is below 2^53. Past 2^52 the product is rounded; the
-- remainder is then recovered from the exact products a * b and q * c.
local function muldivmod(a, b, c)
  local p = a * b
  local q = math.floor(p / c)
  local r
  if p < TWO_52 then
    r = p - q * c
  else
    local _, e = two_product(a, b)
    local qc, qe = two_product(q, c)
    r = (p - qc) + (e - qe)
  end
  while r < 0 do
    q = q - 1
    r = r + c
  end
  while r >= c do
    q = q + 1
    r = r - c
  end
  return q, r
end

-- floor(a / c) for whole a >= 0 below 2^53 and 0 < c < 2^50.
local function floor_div(a, c)
  local q = muldivmod(a, 1, c)
  return q
end

-- Microseconds to whole milliseconds, rounded up (a client must not come back early); 0 for
-- a time that is not in the future.
local function ceil_ms(us)
  if us <= 0 then
    return 0
  end
  local q, r = muldivmod(us, 1, 1000)
  if r > 0 then
    return q + 1
  end
  return q
end

-- ceil_ms of `us` microseconds plus a fraction of one (`frac` > 0 ticks of it).
local function ceil_ms_frac(us, frac)
  if frac == 0 then
    return ceil_ms(us)
  end
  if us < 0 then
    return 0
  end
  return floor_div(us, 1000) + 1
end

-- A key's time to live in milliseconds for a state that matters `us` (and `frac` ticks) more.
local function ttl_ms(us, frac)
  local ms = ceil_ms_frac(us, frac or 0)
  if replay then
    return math.max(REPLAY_MIN_TTL_MS, ms)
  end
  return math.max(1, ms)
end

local function flag(b)
  if b then
    return 1
  end
  return 0
end

-- The value prefetch() read for `key`, taken once; else read now. nil for an absent key.
local function take(key)
  local stored = prefetched[key]
  if stored == nil then
    return redis.call('GET', key) or nil
  end
  prefetched[key] = nil
  return stored or nil
end

-- `stored`, read from `key`, split by `pattern` (up to three captures). A value of another
-- shape than the algorithm writes is an error: never guess.
local function fields(key, stored, pattern, shape)
  local a, b, c = string.match(stored, pattern)
  if not a then
    error({err = 'ERR sluice: key ' .. key .. ' holds "' .. stored .. '", not ' .. shape})
  end
  return a, b, c
end

-- The string at `key` split by `pattern` (up to three captures), after `true`; `false` for an
-- absent key.
local function read_fields(key, pattern, shape)
  local stored = take(key)
  if not stored then
    return false
  end
  return true, fields(key, stored, pattern, shape)
end

-- A schedule's time (schedule.lua): its microseconds, and ticks when there are any.
local TIME_PATTERN = '^(%d+):?(%d*)$'

-- A schedule's key holds its time and, when the key is leased, its lease ledger (ledger.lua)
-- after a space: "<time>[ <ledger>]", either part possibly empty. One key, where a time and a
-- ledger of keys of their own cost a new bucket's quota funding two writes with an expiry
-- each, two keys to read and two to keep (one funding of 64 new buckets: 13.1 us of Redis an
-- ask where it took 15.5, and 164 B less a bucket kept). The parts a call changes are
-- written at its end, once, by flush().
-- The cell of `key`, read once a call: {time, ledger} ('' for an absent part), and once a
-- part is written, how long it must live (in ms, [3] the time's, [4] the ledger's).
local function cell(key)
  local c = cells[key]
  if c then
    return c
  end
  c = {'', ''}
  local stored = take(key)
  if stored then
    local space = string.find(stored, ' ', 1, true)
    if space then
      c[1], c[2] = string.sub(stored, 1, space - 1), string.sub(stored, space + 1)
    else
      c[1] = stored
    end
  end
  cells[key] = c
  return c
end

-- Sets part `part` (1 the time, 2 the ledger) of `key`'s cell to `value`, which must live
-- `ms` milliseconds (0: nothing to keep), for flush().
local function set_cell(key, part, value, ms)
  local c = cell(key)
  if not c.written then
    c.written = true
    written_cells[#written_cells + 1] = key
  end
  c[part] = value
  c[part + 2] = ms
end

-- How long a time this call did not write must live at `now`, in ms: while it lies ahead.
local function time_ttl_ms(time, now)
  local us, ticks = string.match(time, TIME_PATTERN)
  if us then
    us, ticks = tonumber(us), tonumber(ticks) or 0
    if us > now or (us == now and ticks > 0) then
      return ttl_ms(us - now, ticks)
    end
  end
  return 0
end

-- How long a ledger this call did not write must live at `now`, in ms: while its last entry
-- does (an entry's expiry follows its units: ledger.lua).
local function ledger_ttl_ms(ledger, now)
  local last = 0
  for expires in string.gmatch(ledger, '=%d+:(%d+)') do
    last = math.max(last, tonumber(expires))
  end
  if last > now then
    return ttl_ms(last - now)
  end
  return 0
end

-- Writes every cell this call changed: one SET with its expiry each (a DEL for one that holds
-- nothing any more). Every script that decides calls it last. (Each writer says how long its
-- part must live: deriving it here from the parts cost a fresh funding a fifth of its time.)
local function flush()
  for _, key in ipairs(written_cells) do
    local c = cells[key]
    local ms = c[3] or time_ttl_ms(c[1], call_now)
    local ledger_ms = c[4] or ledger_ttl_ms(c[2], call_now)
    if ledger_ms > ms then
      ms = ledger_ms
    end
    if ms == 0 then
      redis.call('DEL', key)
    elseif c[2] == '' then
      redis.call('SET', key, c[1], 'PX', ms)
    else
      redis.call('SET', key, c[1] .. ' ' .. c[2], 'PX', ms)
    end
  end
  written_cells = {}
end

-- Reads `keys` with one MGET, keeping their values for take(). MGET answers false both for an
-- absent key and for a key of another type: one EXISTS of those keys tells whether all are
-- absent (kept as false); if not, each is read again by GET, which tells them apart, an error
-- for the second. (One command for a call's absent keys, where a GET each cost a quiet
-- bucket's funding two.)
local function prefetch(keys)
  local values = redis.call('MGET', unpack(keys))
  local missing = {}
  for i, key in ipairs(keys) do
    if values[i] then
      prefetched[key] = values[i]
    else
      missing[#missing + 1] = key
    end
  end
  if #missing > 0 and redis.call('EXISTS', unpack(missing)) == 0 then
    for _, key in ipairs(missing) do
      prefetched[key] = false
    end
  end
end

-- An algorithm's parameters (`p`): the `count` numbers of `args` (a call's ARGV) after `at`.
local function read_params(args, at, count)
  local p = {}
  for j = 1, count do
    p[j] = tonumber(args[at + j])
  end
  return p
end

-- A check's six numbers in a reply.
local CHECK_REPLY = '%d %d %d %d %d %d'

-- A script's answer: one string of integers separated by spaces, the numbers of each check
-- or lease ask in `tuples`, in order, as `format` writes them (a check's six unless given).
-- One string is a single value for the server's Redis client to read, where an array of six
-- integers cost it more than the rest of its work on a call (BENCHMARKS.md, server).
local function reply(tuples, format)
  format = format or CHECK_REPLY
  local parts = {}
  for i, t in ipairs(tuples) do
    parts[i] = string.format(format, unpack(t))
  end
  return table.concat(parts, ' ')
end
