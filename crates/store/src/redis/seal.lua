-- Seal: stores the signed statement of a receipt-chain entry (signed by the gate after the script
-- that recorded the completion and appended the entry), in the entry and in the completed record.
-- Idempotent; an entry that already holds a statement keeps it.
-- KEYS[1]: the action's record key
-- KEYS[2]: the agent's lease index (unused)
-- KEYS[3]: the agent's receipt chain
-- ARGV[1]: the index member, the encoded action key (unused)
-- ARGV[2]: the entry's seq
-- ARGV[3]: its statement
-- Returns: { now, 'sealed', 1 } | { now, 'sealed', 0 } when the entry does not exist
local seq, statement = tonumber(ARGV[2]), ARGV[3]
local raw = redis.call('LINDEX', KEYS[3], seq - 1)
if not raw then
  return { NOW, 'sealed', 0 }
end
local entry = cmsgpack.unpack(raw)
if entry[E_STATEMENT] == '' then
  entry[E_STATEMENT] = statement
  redis.call('LSET', KEYS[3], seq - 1, cmsgpack.pack(entry))
end
local rec = load(KEYS[1])
if rec and rec[STATE] == COMPLETED and rec[RECEIPT_SEQ] == seq and (rec[STATEMENT] or '') == '' then
  rec[STATEMENT] = statement
  save(KEYS[1], rec)
end
return { NOW, 'sealed', 1 }
