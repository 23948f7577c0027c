#!lua name=restms_v8
-- The RestMS engine's server-side functions (feeds/redis, docs/CLUSTER.md). Each call
-- touches keys of one hash slot only, so each is atomic on the master of that slot.
--
-- Catalogue (slot {<ns>:cat}): hash KEYS[1] with field "v" (the version) and one field
-- per resource; stream KEYS[2], the change log, entry id 0-<version> listing the
-- fields that change changed.
-- Pipe (slot {<ns>:b<k>}): stream "s" with entry ids 0-<position> (fields m: the
-- message record, z: its size, e: when it expires, ms), hash "h" (next: the last
-- position issued, bytes, ver: grows with every change, md: max deliveries, r:<pos>:
-- redeliveries, d:<pos>: deleted contents); per bucket a sorted set of leases.
-- Times are wall-clock milliseconds the caller passes (one clock for arrival, expiry
-- and leases, as the nodes keep it).

local function num(value)
  return tonumber(value or '0') or 0
end

-- ---------------------------------------------------------------- catalogue
-- ARGV: expected version ("*": any), channel, then field, value pairs ("": delete).
-- Returns {1, version} when made, {0, current version} when the caller's was stale.
local function cat_change(keys, args)
  local cat, log = keys[1], keys[2]
  local v = num(redis.call('HGET', cat, 'v'))
  if args[1] ~= '*' and num(args[1]) ~= v then
    return {0, v}
  end
  local entry = {}
  for i = 3, #args, 2 do
    local field, value = args[i], args[i + 1]
    if value == '' then
      redis.call('HDEL', cat, field)
    else
      redis.call('HSET', cat, field, value)
    end
    entry[#entry + 1] = 'f'
    entry[#entry + 1] = field
  end
  if #entry == 0 then
    entry = {'f', ''}
  end
  v = redis.call('HINCRBY', cat, 'v', 1)
  redis.call('XADD', log, 'MAXLEN', '~', '10000', '0-' .. v, unpack(entry))
  redis.call('SPUBLISH', args[2], tostring(v))
  return {1, v}
end

-- ARGV: the version the caller holds. Returns {version} when it is current, {version,
-- "delta", field, value ("": gone), ...} with every field changed since, or {version,
-- "full"} when the log no longer reaches back that far: the caller then reads the hash
-- in pieces (HSCAN), so that a large catalogue never holds the master in one call.
local function cat_since(keys, args)
  local cat, log = keys[1], keys[2]
  local v = num(redis.call('HGET', cat, 'v'))
  local since = num(args[1])
  if since == v then
    return {v}
  end
  if since > 0 and since < v then
    local first = redis.call('XRANGE', log, '-', '+', 'COUNT', 1)
    if #first > 0 and num(string.match(first[1][1], '%-(%d+)$')) <= since + 1 then
      local out, seen = {v, 'delta'}, {}
      for _, change in ipairs(redis.call('XRANGE', log, '0-' .. (since + 1), '+')) do
        local fields = change[2]
        for j = 2, #fields, 2 do
          local field = fields[j]
          if field ~= '' and not seen[field] then
            seen[field] = true
            out[#out + 1] = field
            out[#out + 1] = redis.call('HGET', cat, field) or ''
          end
        end
      end
      return out
    end
  end
  return {v, 'full'}
end

-- ---------------------------------------------------------------- pipes
local function entry_field(fields, name)
  for j = 1, #fields, 2 do
    if fields[j] == name then
      return fields[j + 1]
    end
  end
  return nil
end

-- Remove one entry (by id and fields) from a pipe, keeping its byte count.
local function remove(s, h, id, fields)
  redis.call('XDEL', s, id)
  local pos = string.match(id, '%-(%d+)$')
  redis.call('HINCRBY', h, 'bytes', -num(entry_field(fields, 'z')))
  redis.call('HDEL', h, 'r:' .. pos, 'd:' .. pos)
end

-- A pipe's marks only grow: the highest position acknowledged ('acked') and the
-- highest whose message left unacknowledged, never to be delivered again ('lost':
-- dropped by overflow, expired, dead-lettered). A reader that resumes is told of a gap
-- from them (feeds.values.PipeInfo.gap).
local function mark(h, field, pos)
  if num(pos) > num(redis.call('HGET', h, field)) then
    redis.call('HSET', h, field, pos)
  end
end

local function position_of(id)
  return string.match(id, '%-(%d+)$')
end

local function pipe_key(s)
  return string.match(s, ':s:(.*)$')
end

-- What the traffic mirror needs of an entry a call removes (feeds/redis/mirror.py),
-- appended to out: its size, its record's address, properties, headers and feed (JSON),
-- and its arrival time (exact: seventeen digits); never its contents. A record that
-- cannot be read is left out: the mirror never fails the call it rides on.
local function head(fields, out)
  local ok, r = pcall(cjson.decode, entry_field(fields, 'm') or '')
  if ok and type(r) == 'table' then
    local done, text = pcall(cjson.encode, {r[1], r[2], r[3], r[4]})
    if done then
      out[#out + 1] = entry_field(fields, 'z') or '0'
      out[#out + 1] = text
      out[#out + 1] = string.format('%.17g', tonumber(r[5]) or 0)
    end
  end
end

-- How long a publish's mark (below) is kept, seconds: longer than the engine tries to
-- settle a publish whose outcome it does not know (feeds/redis/settling.py).
local MARK_TTL = 60

-- KEYS: s1, h1, s2, h2, ..., and, for a publish that must be taken back exactly should
-- it fail (a durable one, or one with message ids), its mark: a key of the bucket's
-- slot and of this call alone. ARGV: channel, now, origin, then per pipe: max_messages,
-- max_bytes, overflow, redeliveries (what each message placed there has had: 0 but for
-- a hand-over), n, then n times: size, expires (0: never), record; then, only with the
-- traffic mirror on, '1'. Returns per pipe: how many drop-oldest dropped, then each
-- message's position (0: it did not fit, skipped); with the mirror on, then one more
-- item: per pipe, the heads (head) of those it dropped, the oldest first.
-- A message is one XADD: the counters of its pipe move once a call, by what it placed
-- (each write of a function is a command in the AOF and to the replicas).
-- The wake-up (SPUBLISH on the bucket's channel) names the pipes, then carries, per
-- pipe, the first message placed when a reader may take it as it is (no expiry, no
-- redelivery, none dropped in this call, at most CARRY bytes): "\n<origin>" once (the
-- caller's, which wakes its own readers), then "\n<pipe> <position> <size> <length>
-- \n<record>" each. Another node's reader waiting at that position is answered from it
-- without reading the stream again (feeds/redis/reading.py).
-- The mark records the positions placed (pipes by ',', positions by ' '), so settle
-- finds them whether or not the caller heard the answer; a mark that exists already
-- means settle came first: nothing is placed (error SETTLED).
local CARRY = 8192

local function place(keys, args)
  local out, woken, dropped, carried, marks = {}, {}, {}, {}, {}
  local a = 4
  local marker = nil
  if #keys % 2 == 1 then
    marker = keys[#keys]
    if redis.call('EXISTS', marker) == 1 then
      return redis.error_reply('SETTLED this publish was settled before it was placed')
    end
  end
  for k = 1, #keys - 1, 2 do
    local s, h = keys[k], keys[k + 1]
    local maxm, maxb, overflow = num(args[a]), num(args[a + 1]), args[a + 2]
    local redelivered, n = num(args[a + 3]), num(args[a + 4])
    a = a + 5
    local at = #out + 1
    out[at] = 0
    local len = redis.call('XLEN', s)
    local bytes = num(redis.call('HGET', h, 'bytes'))
    local last = num(redis.call('HGET', h, 'next'))
    local placed, added, carry = 0, 0, nil
    for _ = 1, n do
      -- The size goes to XADD as the caller wrote it: a Lua number would be formatted
      -- again (with %.17g) on its way to Redis, for every message.
      local written, expires, record = args[a], args[a + 1], args[a + 2]
      local size = num(written)
      a = a + 3
      if overflow == 'drop-oldest' then
        while len > 0 and (len >= maxm or bytes + size > maxb) do
          local first = redis.call('XRANGE', s, '-', '+', 'COUNT', 1)[1]
          bytes = bytes - num(entry_field(first[2], 'z'))
          remove(s, h, first[1], first[2])
          mark(h, 'lost', position_of(first[1]))
          len = len - 1
          out[at] = out[at] + 1
          -- Kept aside: the mirror's flag comes after every pipe's messages.
          local pipe = (k + 1) / 2
          dropped[pipe] = dropped[pipe] or {}
          table.insert(dropped[pipe], first[2])
        end
      end
      if len >= maxm or bytes + size > maxb then
        out[#out + 1] = 0
      else
        last = last + 1
        if expires ~= '0' then
          redis.call('XADD', s, '0-' .. last, 'm', record, 'z', written, 'e', expires)
        else
          redis.call('XADD', s, '0-' .. last, 'm', record, 'z', written)
        end
        if redelivered > 0 then
          redis.call('HSET', h, 'r:' .. last, redelivered)
        end
        if placed == 0 and expires == '0' and redelivered == 0 and #record <= CARRY then
          carry = {last, size, record}
        end
        placed = placed + 1
        added = added + size
        len = len + 1
        bytes = bytes + size
        out[#out + 1] = last
      end
    end
    if placed > 0 then
      redis.call('HINCRBY', h, 'next', placed)
      redis.call('HINCRBY', h, 'bytes', added)
    end
    redis.call('HINCRBY', h, 'ver', 1)
    woken[#woken + 1] = pipe_key(s)
    if marker then
      marks[#marks + 1] = table.concat(out, ' ', at + 1, #out)
    end
    if carry and out[at] == 0 then
      carried[#carried + 1] = '\n' .. pipe_key(s) .. ' ' .. carry[1] .. ' ' .. carry[2] .. ' '
        .. #carry[3] .. '\n' .. carry[3]
    end
  end
  if marker then
    redis.call('SET', marker, table.concat(marks, ','), 'EX', MARK_TTL)
  end
  local news = table.concat(woken, ' ')
  if #carried > 0 then
    news = news .. '\n' .. args[3] .. table.concat(carried)
  end
  redis.call('SPUBLISH', args[1], news)
  if args[a] == '1' then -- the mirror's flag, after the last pipe's messages
    local heads = {}
    for pipe = 1, math.floor(#keys / 2) do
      heads[pipe] = {}
      for _, fields in ipairs(dropped[pipe] or {}) do
        head(fields, heads[pipe])
      end
    end
    out[#out + 1] = heads
  end
  return out
end

-- KEYS: a publish's mark (place), then the pipes it placed into (s1, h1, ..., in
-- place's order). ARGV: channel. Takes back the copies the mark records that are still
-- there, and leaves the mark settled, so that this publish's place, should it reach the
-- master only now, places nothing. Returns per pipe a letter per copy ('t': taken back;
-- 'g': gone already, acknowledged, dropped or expired; 'n': none placed), the pipes
-- separated by ','; no letters for a pipe: nothing was placed there. Asked again, it
-- answers the same (and writes the mark again, so that the caller's WAIT confirms it).
local function settle(keys, args)
  local marker = keys[1]
  local held = redis.call('GET', marker)
  if held and string.sub(held, 1, 1) == '=' then
    redis.call('SET', marker, held, 'EX', MARK_TTL)
    return string.sub(held, 2)
  end
  local placed = {}
  for part in string.gmatch((held or '') .. ',', '([^,]*),') do
    placed[#placed + 1] = part
  end
  local fates, woken = {}, {}
  for k = 2, #keys, 2 do
    local s, h = keys[k], keys[k + 1]
    local fate = {}
    for pos in string.gmatch(held and placed[k / 2] or '', '%d+') do
      if pos == '0' then
        fate[#fate + 1] = 'n'
      else
        local found = redis.call('XRANGE', s, '0-' .. pos, '0-' .. pos)
        if #found > 0 then
          remove(s, h, found[1][1], found[1][2])
          mark(h, 'lost', pos) -- a reader may have seen it: told as a gap
          fate[#fate + 1] = 't'
        else
          fate[#fate + 1] = 'g'
        end
      end
    end
    if string.find(table.concat(fate), 't', 1, true) then
      redis.call('HINCRBY', h, 'ver', 1)
      woken[#woken + 1] = pipe_key(s)
    end
    fates[#fates + 1] = table.concat(fate)
  end
  local answer = table.concat(fates, ',')
  redis.call('SET', marker, '=' .. answer, 'EX', MARK_TTL)
  if #woken > 0 then
    redis.call('SPUBLISH', args[1], table.concat(woken, ' '))
  end
  return answer
end

-- KEYS: s1, h1, ... ARGV: then per pipe: max_messages, max_bytes, n, n sizes. Returns
-- per pipe how many of its messages fit, in order, as it is now.
local function room(keys, args)
  local out, a = {}, 1
  for k = 1, #keys, 2 do
    local s, h = keys[k], keys[k + 1]
    local maxm, maxb, n = num(args[a]), num(args[a + 1]), num(args[a + 2])
    a = a + 3
    local len = redis.call('XLEN', s)
    local bytes = num(redis.call('HGET', h, 'bytes'))
    local fit = 0
    for i = 1, n do
      local size = num(args[a + i - 1])
      if fit == i - 1 and len < maxm and bytes + size <= maxb then
        fit = i
        len = len + 1
        bytes = bytes + size
      end
    end
    a = a + n
    out[#out + 1] = fit
  end
  return out
end

-- Drop what expired among entries just read; returns those left and how many went.
-- heads (the mirror on): a table the heads of those that went are appended to.
local function unexpired(s, h, entries, now, heads)
  local kept, gone = {}, 0
  for _, entry in ipairs(entries) do
    local expires = entry_field(entry[2], 'e')
    if expires and num(expires) <= now then
      remove(s, h, entry[1], entry[2])
      mark(h, 'lost', position_of(entry[1]))
      gone = gone + 1
      if heads then
        head(entry[2], heads)
      end
    else
      kept[#kept + 1] = entry
    end
  end
  if gone > 0 then
    redis.call('HINCRBY', h, 'ver', 1)
  end
  return kept, gone
end

-- KEYS: s, h. ARGV: first position (0: the oldest), count, now, whether this is a use
-- of the pipe (1: its idle time starts again, Q1; 0: an administrator's look), and,
-- only with the traffic mirror on, '1'. Returns {asynclet, expired, oldest (0: none),
-- held, then per message: position, record, size, redeliveries, deleted contents ("":
-- none)}; with the mirror on, then one more item: the heads (head) of those that expired.
local function range(keys, args)
  local s, h = keys[1], keys[2]
  local from, count, now = num(args[1]), num(args[2]), num(args[3])
  local heads = args[5] == '1' and {} or nil
  if args[4] == '1' then
    redis.call('HSET', h, 'at', now)
  end
  local start = from > 0 and ('0-' .. from) or '-'
  local read = {}
  if count > 0 then
    read = redis.call('XRANGE', s, start, '+', 'COUNT', count)
  end
  local entries, gone = unexpired(s, h, read, now, heads)
  local first = redis.call('XRANGE', s, '-', '+', 'COUNT', 1)
  local oldest = #first > 0 and num(string.match(first[1][1], '%-(%d+)$')) or 0
  local out = {num(redis.call('HGET', h, 'next')) + 1, gone, oldest, redis.call('XLEN', s)}
  for _, entry in ipairs(entries) do
    local pos = string.match(entry[1], '%-(%d+)$')
    out[#out + 1] = num(pos)
    out[#out + 1] = entry_field(entry[2], 'm')
    out[#out + 1] = num(entry_field(entry[2], 'z'))
    out[#out + 1] = num(redis.call('HGET', h, 'r:' .. pos))
    out[#out + 1] = redis.call('HGET', h, 'd:' .. pos) or ''
  end
  if heads then
    out[#out + 1] = heads
  end
  return out
end

-- KEYS: s, h. ARGV: channel, position, now (0: an administrator's purge, not a use),
-- and, only with the traffic mirror on, '1'. Removes it and every older one (the
-- cumulative DELETE); returns how many went, or with the mirror on {how many, then
-- the heads (head) of those that went}.
local function ack(keys, args)
  local s, h = keys[1], keys[2]
  local pos = num(args[2])
  local heads = args[4] == '1' and {0} or nil
  if args[3] ~= '0' then
    redis.call('HSET', h, 'at', args[3])
  end
  if pos > num(redis.call('HGET', h, 'next')) then
    return heads or 0 -- the asynclet or beyond: nothing (A7)
  end
  mark(h, 'acked', pos)
  local gone = redis.call('XRANGE', s, '-', '0-' .. pos)
  if #gone == 0 then
    return heads or 0
  end
  local bytes = 0
  for _, entry in ipairs(gone) do
    bytes = bytes + num(entry_field(entry[2], 'z'))
    local at = string.match(entry[1], '%-(%d+)$')
    redis.call('HDEL', h, 'r:' .. at, 'd:' .. at)
    if heads then
      head(entry[2], heads)
    end
  end
  redis.call('XTRIM', s, 'MINID', '0-' .. (pos + 1))
  redis.call('HINCRBY', h, 'bytes', -bytes)
  redis.call('HINCRBY', h, 'ver', 1)
  redis.call('SPUBLISH', args[1], pipe_key(s))
  if heads then
    heads[1] = #gone
    return heads
  end
  return #gone
end

-- KEYS: s, h. ARGV: channel, position, 'lost' when the message leaves for good
-- unacknowledged (dead-lettered, or withdrawn), and for a withdrawal the record placed
-- there. Removes that one message; returns its record and redeliveries, or nothing when
-- it is not there (or another record holds the position).
local function take_out(keys, args)
  local s, h = keys[1], keys[2]
  local found = redis.call('XRANGE', s, '0-' .. args[2], '0-' .. args[2])
  if #found == 0 then
    return {}
  end
  if args[4] and entry_field(found[1][2], 'm') ~= args[4] then
    return {}  -- another message holds the position: not the one to take back
  end
  local redelivered = num(redis.call('HGET', h, 'r:' .. args[2]))
  remove(s, h, found[1][1], found[1][2])
  if args[3] == 'lost' then
    mark(h, 'lost', args[2])
  end
  redis.call('HINCRBY', h, 'ver', 1)
  redis.call('SPUBLISH', args[1], pipe_key(s))
  return {entry_field(found[1][2], 'm'), redelivered}
end

-- KEYS: s, h. ARGV: position, index. Deletes one delivered content (D6): 1, or 0 when
-- the message or content is not there.
local function delete_content(keys, args)
  local s, h = keys[1], keys[2]
  if #redis.call('XRANGE', s, '0-' .. args[1], '0-' .. args[1]) == 0 then
    return 0
  end
  local field = 'd:' .. args[1]
  local deleted = redis.call('HGET', h, field) or ''
  for index in string.gmatch(deleted, '[^,]+') do
    if index == args[2] then
      return 0
    end
  end
  redis.call('HSET', h, field, deleted == '' and args[2] or (deleted .. ',' .. args[2]))
  redis.call('HINCRBY', h, 'ver', 1)
  return 1
end

-- KEYS: the bucket's leases, its sweep lock. ARGV: channel, now, lock ms, key prefix
-- of the bucket's pipes. A lease that ran out on a message still there moves it to the
-- pipe's next position with one more redelivery, or, past the pipe's max deliveries,
-- takes it out. Returns per lease that ran out: pipe, old position, new position (0:
-- taken out), record, redeliveries.
local function sweep(keys, args)
  local leases, lock = keys[1], keys[2]
  if not redis.call('SET', lock, '1', 'NX', 'PX', args[3]) then
    return {}
  end
  local due = redis.call('ZRANGEBYSCORE', leases, '-inf', args[2], 'LIMIT', 0, 1000)
  local out, woken = {}, {}
  for _, member in ipairs(due) do
    redis.call('ZREM', leases, member)
    local pipe, pos = string.match(member, '^(.*) (%d+)$')
    local s, h = args[4] .. ':s:' .. pipe, args[4] .. ':h:' .. pipe
    local found = redis.call('XRANGE', s, '0-' .. pos, '0-' .. pos)
    if #found > 0 and redis.call('EXISTS', h) == 1 then
      local fields = found[1][2]
      local times = num(redis.call('HGET', h, 'r:' .. pos)) + 1
      local deleted = redis.call('HGET', h, 'd:' .. pos)
      local record = entry_field(fields, 'm')
      remove(s, h, found[1][1], fields)
      local moved = 0
      if times < num(redis.call('HGET', h, 'md')) then
        moved = redis.call('HINCRBY', h, 'next', 1)
        redis.call('XADD', s, '0-' .. moved, unpack(fields))
        redis.call('HINCRBY', h, 'bytes', num(entry_field(fields, 'z')))
        redis.call('HSET', h, 'r:' .. moved, times)
        if deleted then
          redis.call('HSET', h, 'd:' .. moved, deleted)
        end
      else
        mark(h, 'lost', pos)
      end
      redis.call('HINCRBY', h, 'ver', 1)
      woken[#woken + 1] = pipe
      out[#out + 1] = pipe
      out[#out + 1] = num(pos)
      out[#out + 1] = moved
      out[#out + 1] = record
      out[#out + 1] = times
    end
  end
  if #woken > 0 then
    redis.call('SPUBLISH', args[1], table.concat(woken, ' '))
  end
  return out
end

-- ---------------------------------------------------------------- owners
-- One node runs each webhook pipe's deliveries, and each bridge (feeds/redis/owners.py).
-- Slot {<ns>:own}: KEYS[1] the fencing counter, KEYS[2] the live nodes (a sorted set:
-- member the node, score when its registration runs out, in the master's clock, as
-- the locks' own expiry is), KEYS[3] how many things each live node holds (a hash),
-- then one lock per thing owned, holding "<node> <token>".
-- ARGV: the node, the lock's life in ms, how many things the node knows in all
-- (webhook pipes and bridges), how many it holds besides these locks, the slack (0 in
-- a round; 1 for a thing just made or started on the node), '1' when the node counts
-- among the live (it runs webhook pipes), else '0', and how many of the locks (the
-- first ones) are overdue: found free by the node's last round too.
-- The node's share is ceil(things / live nodes). Every lock the node holds is renewed
-- (the node frees its excess itself, once it stopped what those run); a free lock is
-- taken with a new token (from the counter: it only grows) while the node holds fewer
-- than its share plus the slack, and an overdue one whatever the share (nobody under
-- theirs took it for a round: their views differ, or one is stalled). Returns {live
-- nodes, share, the fewest things a live node holds (as each last said), then per
-- lock the node's token, 0 where another node holds it, -1 where it is free and the
-- node took no more}.
local function own(keys, args)
  local fence, live, counts, node = keys[1], keys[2], keys[3], args[1]
  local ttl, things, mine, slack = num(args[2]), num(args[3]), num(args[4]), num(args[5])
  local clock = redis.call('TIME')
  local now = num(clock[1]) * 1000 + math.floor(num(clock[2]) / 1000)
  if args[6] == '1' then
    redis.call('ZADD', live, now + ttl, node)
  end
  local expired = redis.call('ZRANGEBYSCORE', live, '-inf', now)
  if #expired > 0 then
    redis.call('ZREM', live, unpack(expired))
    redis.call('HDEL', counts, unpack(expired))
  end
  local nodes = math.max(redis.call('ZCARD', live), 1)
  local share = math.ceil(things / nodes)
  local out, free = {nodes, share, 0}, {}
  for i = 4, #keys do
    local held = redis.call('GET', keys[i])
    local token = 0
    if not held then
      free[#free + 1] = i
    else
      local who, was = string.match(held, '^(.*) (%d+)$')
      if who == node then
        token = num(was)
        mine = mine + 1
        redis.call('PEXPIRE', keys[i], ttl)
      end
    end
    out[i] = token
  end
  local overdue = 3 + num(args[7])
  for _, i in ipairs(free) do
    if i <= overdue or mine < share + slack then
      local token = redis.call('INCR', fence)
      redis.call('SET', keys[i], node .. ' ' .. token, 'PX', ttl)
      out[i] = token
      mine = mine + 1
    else
      out[i] = -1
    end
  end
  if args[6] == '1' then
    redis.call('HSET', counts, node, mine)
  end
  local least = nil
  local members = redis.call('ZRANGE', live, 0, -1)
  if #members > 0 then
    for _, count in ipairs(redis.call('HMGET', counts, unpack(members))) do
      if least == nil or num(count) < least then
        least = num(count)
      end
    end
  end
  out[3] = least or 0
  return out
end

-- KEYS: the live nodes and their counts (own), then locks. ARGV: the node, and '1'
-- when it leaves (it no longer counts among the live). Frees the locks the node holds
-- (a node that stops hands its things over at once rather than after the locks' life;
-- one over its share hands its excess over). Returns how many it freed.
local function disown(keys, args)
  local freed = 0
  if args[2] == '1' then
    redis.call('ZREM', keys[1], args[1])
    redis.call('HDEL', keys[2], args[1])
  end
  for i = 3, #keys do
    local held = redis.call('GET', keys[i])
    if held and string.match(held, '^(.*) %d+$') == args[1] then
      redis.call('DEL', keys[i])
      freed = freed + 1
    end
  end
  return freed
end

-- KEYS: a webhook pipe's state hash. ARGV: the writer's fencing token (0: not a
-- delivery worker's write: a PUT's), the record's generation, the record. A worker's
-- write is refused (-1) once a newer owner wrote, and any write (-2) that would take
-- the generation back: a stale worker never overwrites a newer owner's or a PUT's state.
-- 0: the pipe is gone (its state is not made again).
local function hook_save(keys, args)
  local h = keys[1]
  local token, generation = num(args[1]), num(args[2])
  if redis.call('EXISTS', h) == 0 then
    return 0
  end
  if token > 0 and token < num(redis.call('HGET', h, 'fence')) then
    return -1
  end
  if generation < num(redis.call('HGET', h, 'gen')) then
    return -2
  end
  if token > 0 then
    redis.call('HSET', h, 'fence', token)
  end
  redis.call('HSET', h, 'gen', generation, 'hook', args[3])
  return 1
end

redis.register_function('restms_v8_cat_change', cat_change)
redis.register_function{function_name = 'restms_v8_cat_since', callback = cat_since,
  flags = {'no-writes'}}
redis.register_function('restms_v8_place', place)
redis.register_function{function_name = 'restms_v8_room', callback = room,
  flags = {'no-writes'}}
redis.register_function('restms_v8_range', range)
redis.register_function('restms_v8_ack', ack)
redis.register_function('restms_v8_take_out', take_out)
redis.register_function('restms_v8_settle', settle)
redis.register_function('restms_v8_delete_content', delete_content)
redis.register_function('restms_v8_sweep', sweep)
redis.register_function('restms_v8_own', own)
redis.register_function('restms_v8_disown', disown)
redis.register_function('restms_v8_hook_save', hook_save)
