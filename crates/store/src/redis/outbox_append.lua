-- Outbox append: writes each event for its webhook unless that member is stored already
-- (pending, delivered or undeliverable), pending and due now.
-- KEYS[1]: og:{outbox}:entries
-- KEYS[2]: og:{outbox}:due
-- ARGV: five per entry: member, webhook, event id, event type, body
-- Returns: { now, 'appended', how many were written }
local written = 0
for i = 1, #ARGV, 5 do
  local member = ARGV[i]
  if redis.call('HEXISTS', KEYS[1], member) == 0 then
    entry_save(KEYS[1], member,
      { ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], NOW, 0, PENDING, NOW, '', '', 0 })
    redis.call('ZADD', KEYS[2], NOW, member)
    written = written + 1
  end
end
return { NOW, 'appended', written }
