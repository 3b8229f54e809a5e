-- sluice fund: the quota service's fundings, the lease asks that sluice-server makes for its
-- quota streams: each with a span, holding nothing, giving nothing back, with no secret.
-- Follows ledger.lua. Grants and writes exactly what lease.lua would for the same asks, for
-- half of its work in Redis at scale: a bucket at one Envoy is one holder alone in its ledger,
-- and such an ask is funded without the general bookkeeping (lease() in ledger.lua funds any
-- other), its ledger read with one match, its grant taken by grant() in schedule.lua where
-- the algorithm is a bucket.
--
-- ARGV[1]  the time (see clock() in prelude.lua)
-- ARGV[2]  the holder
-- ARGV[3]  the number of asks
-- ARGV[4]  the number of terms
-- then the terms, as lease.lua takes them (read_terms() in ledger.lua);
-- then per ask: its terms' number (from 1), want, demand (units a thousand seconds), carry
-- (thousandths of a unit its span's earlier grants left over).
-- KEYS[2i - 1], KEYS[2i]  ask i's state key and ledger key (one hash tag).
--
-- Answers per ask the nine numbers lease.lua does.

local now = clock(ARGV[1])
local holder = ARGV[2]
local n = tonumber(ARGV[3])
local terms, at = read_terms(ARGV, 5, tonumber(ARGV[4]))
local ask_terms = {}
-- As lease.lua: every ledger read, and checked for a stranger, before anything is written.
local reads = {}
for i = 1, n do
  local t = terms[tonumber(ARGV[at + 4 * (i - 1)])]
  ask_terms[i] = t
  reads[#reads + 1] = KEYS[2 * i - 1]
  if not t.in_cell then
    reads[#reads + 1] = KEYS[2 * i]
  end
end
prefetch(reads)
-- Per ask whose ledger names at most this holder, live: its entry's units, expiry and
-- demand (0 when it has none); per other ask, the ledger's entries, for lease().
local own_units, own_expires, own_demand, shared = {}, {}, {}, {}
for i = 1, n do
  local t = ask_terms[i]
  local ledger = KEYS[2 * i]
  local stored
  if t.in_cell then
    -- false for none, as prefetch() keeps an absent key.
    stored = read_ledger(KEYS[2 * i - 1], ledger, t) or false
  else
    stored = prefetched[ledger]
  end
  local field, units, expires, demand, secret
  if stored then
    -- One entry: no space in the whole ledger.
    field, units, expires, demand, secret =
      string.match(stored, '^([^= ]+)=(%d+):(%d+):(%d*):?([%w_-]*)$')
  end
  own_units[i], own_expires[i], own_demand[i] = 0, 0, 0
  if field == holder then
    expires = tonumber(expires)
    if expires > now then
      if secret ~= '' then
        return 'stranger ' .. (i - 1)
      end
      own_units[i], own_expires[i], own_demand[i] = tonumber(units), expires, tonumber(demand) or 0
    end
  elseif stored ~= false then
    -- Another holder's entry, several, the pool, or not read yet: the whole ledger.
    local live, pool, pool_expires = entries(KEYS[2 * i - 1], ledger, t, now)
    if stranger(live, holder, '') then
      return 'stranger ' .. (i - 1)
    end
    shared[i] = {live, pool, pool_expires}
  end
end
for _, t in ipairs(terms) do
  -- What alone() answers, with what is the same for every ask of the terms written in: each
  -- number string.format writes costs an ask about a thousand instructions.
  t.alone_reply = string.format('%%d %d 0 %%d %%d %%d 0 %%d 0', ceil_ms(t.ttl))
end

-- The funding of ask `i` whose holder is alone in its ledger: as lease() funds it, whose
-- every step here is the one it takes with no other holder, no pool, nothing held and no
-- secret (its share is then the whole rate).
local function alone(i, t, want, demand, carry)
  local state, ledger = KEYS[2 * i - 1], KEYS[2 * i]
  local share = 0
  if t.capacity > 0 then
    share = t.capacity
  end
  local share_milli = math.floor(share * 1000)
  local wanted = math.max(0, math.min(want, t.max_units))
  wanted = math.min(wanted, math.floor((math.floor(share_milli * t.span / 1000000) + carry) / 1000))
  local fresh = math.max(0, math.min(wanted, t.max_total))
  local granted, limit, remaining = 0, 0, 0
  if fresh > 0 and t.by_schedule then
    local p = t.p
    granted, remaining = grant(state, now, fresh, p[1], p[2], p[3], t.reach)
    limit = p[3]
  else
    local answer
    if fresh > 0 then
      answer = t.run(state, now, -fresh, false, true, t.p, t.reach)
    else
      answer = t.run(state, now, 0, false, false, t.p)
    end
    granted, limit, remaining = answer[7], answer[2], answer[3]
  end
  local pace = 0
  if share > 0 and demand / 1000 > t.capacity then
    pace = math.ceil(1000000 / share)
  end
  local live = own_expires[i] > now
  if granted > 0 or demand > 0 then
    -- Written unless the entry would say the same and live at least half its ttl on.
    if not (live and own_units[i] == granted and own_demand[i] == demand
        and own_expires[i] >= now + t.ttl / 2) then
      write_ledger(state, ledger, t,
        string.format('%s=%d:%d:%d:', holder, granted, now + t.ttl, demand), ttl_ms(t.ttl))
    end
  elseif live then
    write_ledger(state, ledger, t, nil)
  end
  return string.format(t.alone_reply, granted, limit, remaining, pace, share_milli)
end

local out = {}
for i = 1, n do
  local t = ask_terms[i]
  local want, demand, carry = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]),
    tonumber(ARGV[at + 3])
  local s = shared[i]
  if s then
    local ask = {want = want, held = 0, returning = 0, demand = demand, carry = carry}
    out[i] = string.format(LEASE_REPLY,
      unpack(lease(KEYS[2 * i - 1], KEYS[2 * i], s[1], s[2], s[3], now, holder, '', t, ask)))
  else
    out[i] = alone(i, t, want, demand, carry)
  end
  at = at + 4
end
flush()
return table.concat(out, ' ')
