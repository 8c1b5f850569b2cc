-- Sync: a write that changes nothing, so that the WAIT sent right behind it on the same connection
-- covers every earlier write to this action. A re-delivered grant or a repeated Complete writes
-- nothing itself, and WAIT only counts replicas up to the connection's own last write, which may
-- predate the record (another connection, another gate replica, wrote it).
-- Not prepended with the prelude: it reads and decides nothing. Needs Redis >= 7.0 (PEXPIRETIME).
-- KEYS[1]: the action's record key
-- Returns: 1 when the record exists (its expiry was rewritten unchanged), 0 when it does not
local at = redis.call('PEXPIRETIME', KEYS[1])
if at > 0 then
  redis.call('PEXPIREAT', KEYS[1], at)
  return 1
end
return 0
