-- ExtendLease: the holder of a live lease moves its expiry to now + ttl.
-- KEYS[1]: the action's record key
-- KEYS[2]: the agent's lease index
-- ARGV[1]: the index member, the encoded action key
-- ARGV[2]: token
-- ARGV[3]: ttl in ms (> 0)
-- Returns: { now, 'extended', lease_expires_at } | { now, 'token_unknown' } | { now, 'token_mismatch' }
--        | { now, 'already_completed' } | { now, 'lease_expired', token, fencing, lease_expired_at }
local key, token, ttl = KEYS[1], ARGV[2], tonumber(ARGV[3])
if not ttl or ttl <= 0 then
  return redis.error_reply('ERR oncegate: ttl must be positive')
end

local rec = load(key)
if not rec then
  return { NOW, 'token_unknown' }
end
if rec[STATE] == COMPLETED then
  return { NOW, 'already_completed' }
end
if rec[STATE] == RELEASED or rec[TOKEN] ~= token then
  return { NOW, 'token_mismatch' }
end
if NOW >= rec[LEASE_END] then
  return { NOW, 'lease_expired', rec[TOKEN], rec[FENCING], rec[LEASE_END] }
end
rec[LEASE_END] = NOW + ttl
rec[EXPIRES_AT] = 0
save(key, rec)
return { NOW, 'extended', rec[LEASE_END] }
