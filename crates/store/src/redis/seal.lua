-- Seal: stores the statements the gate signed for the heads of one agent's receipt chain and
-- moves the chain's seal mark past them, unless another gate sealed the chain since the gate
-- read it (then nothing is written: that gate's heads cover the same entries). Not prepended with
-- the prelude. An entry that already holds a statement keeps it.
-- KEYS[1]: the agent's receipt chain
-- KEYS[2]: the chain's seal mark: "<seq> <digest>" of its last signed head (absent: none)
-- ARGV[1]: the seal mark the gate read ('' for none)
-- ARGV[2]: the new seal mark
-- ARGV[3], ARGV[4], ...: pairs of a head's seq and its statement
-- Returns: 1 when sealed, 0 when the mark moved meanwhile
if (redis.call('GET', KEYS[2]) or '') ~= ARGV[1] then
  return 0
end
for i = 3, #ARGV, 2 do
  local index = tonumber(ARGV[i]) - 1
  local raw = redis.call('LINDEX', KEYS[1], index)
  if not raw then
    return redis.error_reply('seal: the chain has no entry ' .. ARGV[i])
  end
  local entry = cmsgpack.unpack(raw)
  if entry[8] == '' then
    entry[8] = ARGV[i + 1]
    redis.call('LSET', KEYS[1], index, cmsgpack.pack(entry))
  end
end
redis.call('SET', KEYS[2], ARGV[2])
return 1
