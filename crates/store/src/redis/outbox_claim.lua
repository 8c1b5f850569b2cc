-- Outbox claim: forgets settled entries past their retention (a bounded batch), then claims the
-- pending entries due now: one more attempt each, due again (not claimable) until now + lease.
-- KEYS[1]: og:{outbox}:entries
-- KEYS[2]: og:{outbox}:due
-- KEYS[3]: og:{outbox}:dead
-- KEYS[4]: og:{outbox}:keep
-- ARGV[1]: the most entries to claim
-- ARGV[2]: the claim lease, ms
-- ARGV[3]: the claim (the worker's id for this claim)
-- ARGV[4]: the most settled entries to forget
-- Returns: { now, 'claimed', pending, undeliverable, n, then n entries (MessagePack) }
local expired = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', NOW, 'LIMIT', 0, tonumber(ARGV[4]))
for _, member in ipairs(expired) do
  redis.call('ZREM', KEYS[4], member)
  redis.call('ZREM', KEYS[3], member)
  redis.call('HDEL', KEYS[1], member)
end
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', NOW, 'LIMIT', 0, tonumber(ARGV[1]))
local claimed = {}
for _, member in ipairs(due) do
  local e = entry_load(KEYS[1], member)
  if e and e[O_STATE] == PENDING then
    e[O_ATTEMPTS] = e[O_ATTEMPTS] + 1
    e[O_CLAIM] = ARGV[3]
    e[O_DUE] = NOW + tonumber(ARGV[2])
    entry_save(KEYS[1], member, e)
    redis.call('ZADD', KEYS[2], e[O_DUE], member)
    table.insert(claimed, cmsgpack.pack(e))
  else
    -- Settled, gone, or unreadable: nobody can deliver it; it must not stop later claims.
    redis.call('ZREM', KEYS[2], member)
  end
end
local reply = { NOW, 'claimed', redis.call('ZCARD', KEYS[2]), redis.call('ZCARD', KEYS[3]), #claimed }
for _, packed in ipairs(claimed) do
  table.insert(reply, packed)
end
return reply
