-- Outbox settle: the end of one delivery attempt of a claimed entry. Nothing changes unless the
-- entry is pending under this claim (another worker may have taken it over after its lease).
-- KEYS[1]: og:{outbox}:entries
-- KEYS[2]: og:{outbox}:due
-- KEYS[3]: og:{outbox}:dead
-- KEYS[4]: og:{outbox}:keep
-- ARGV[1]: the member
-- ARGV[2]: the claim
-- ARGV[3]: 'delivered', 'retry' or 'undeliverable'
-- ARGV[4]: retry: when it is due again, ms
-- ARGV[5]: retry, undeliverable: why the attempt failed
-- ARGV[6]: delivered, undeliverable: how long it is kept, ms
-- Returns: { now, 'outbox_settled', 1 when it changed, else 0 }
local e = entry_load(KEYS[1], ARGV[1])
if not e or e[O_STATE] ~= PENDING or e[O_CLAIM] ~= ARGV[2] then
  return { NOW, 'outbox_settled', 0 }
end
if ARGV[3] == 'retry' then
  e[O_DUE] = tonumber(ARGV[4])
  e[O_ERROR] = ARGV[5]
  redis.call('ZADD', KEYS[2], e[O_DUE], ARGV[1])
else
  redis.call('ZREM', KEYS[2], ARGV[1])
  e[O_SETTLED] = NOW
  if ARGV[3] == 'delivered' then
    e[O_STATE], e[O_BODY], e[O_ERROR] = DELIVERED, '', ''
  else
    e[O_STATE], e[O_ERROR] = UNDELIVERABLE, ARGV[5]
    redis.call('ZADD', KEYS[3], NOW, ARGV[1])
  end
  redis.call('ZADD', KEYS[4], NOW + tonumber(ARGV[6]), ARGV[1])
end
entry_save(KEYS[1], ARGV[1], e)
return { NOW, 'outbox_settled', 1 }
