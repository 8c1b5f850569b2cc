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
if rec[1] == 2 then
  return { NOW, 'already_completed' }
end
if rec[1] == 3 or rec[8] ~= token then
  return { NOW, 'token_mismatch' }
end
if NOW >= rec[10] then
  return { NOW, 'lease_expired', rec[8], rec[2], rec[10] }
end
rec[10] = NOW + ttl
rec[7] = rec[10] + rec[5]
save(key, rec)
return { NOW, 'extended', rec[10] }
