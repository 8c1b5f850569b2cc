-- Shared by the webhook outbox scripts: a part of the library (library.rs) of its own; NOW (Redis
-- TIME in ms) is set at the start of every call. The outbox keys share the hash tag {outbox}, so
-- every outbox script touches one Cluster slot:
--   og:{outbox}:entries  hash: member -> entry (MessagePack array, the slots below)
--   og:{outbox}:due      sorted set: pending members by when they may be claimed
--   og:{outbox}:dead     sorted set: undeliverable members by when they were given up
--   og:{outbox}:keep     sorted set: settled members by when they are forgotten
-- A member is the webhook's name, length-prefixed, then the event id (built by the gate, opaque
-- here). The entry layout mirrors OutboxEntry in src/outbox.rs.
local O_WEBHOOK, O_ID, O_TYPE, O_BODY, O_CREATED, O_ATTEMPTS = 1, 2, 3, 4, 5, 6
local O_STATE, O_DUE, O_CLAIM, O_ERROR, O_SETTLED = 7, 8, 9, 10, 11
local PENDING, DELIVERED, UNDELIVERABLE = 1, 2, 3

-- The entry of `member`: nil when absent, false when it cannot be read.
local function entry_load(entries, member)
  local raw = redis.call('HGET', entries, member)
  if not raw then
    return nil
  end
  local ok, e = pcall(cmsgpack.unpack, raw)
  if not ok or type(e) ~= 'table' then
    return false
  end
  return e
end

local function entry_save(entries, member, e)
  redis.call('HSET', entries, member, cmsgpack.pack(e))
end
