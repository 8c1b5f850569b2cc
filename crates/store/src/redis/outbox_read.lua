-- Outbox read: the entries of some members (the undeliverable listing), and the counts.
-- KEYS[1]: og:{outbox}:entries
-- KEYS[2]: og:{outbox}:due
-- KEYS[3]: og:{outbox}:dead
-- ARGV: the members
-- Returns: { now, 'outbox_read', pending, undeliverable, n, then per member: entry or '' }
local reply = { NOW, 'outbox_read', redis.call('ZCARD', KEYS[2]), redis.call('ZCARD', KEYS[3]), #ARGV }
for _, member in ipairs(ARGV) do
  table.insert(reply, redis.call('HGET', KEYS[1], member) or '')
end
return reply
