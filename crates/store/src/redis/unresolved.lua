-- ListUnresolved, one batch of one agent: checks index members against their records, in index
-- order, and drops stale members (record gone, completed or released) from the index.
-- KEYS[1]: the agent's lease index
-- KEYS[2..n+1]: the record keys of the members, in the same order as ARGV
-- ARGV[1..n]: the members (encoded action keys), in index order
-- Returns: { now, 'unresolved', n, then per member: status, fencing, fingerprint, lease_expires_at, holder,
--            token, action, params (what the latest grant was asked for; '' in older records) }
--          status 1: unresolved (lease ended, neither completed nor released; or released with
--                    superseded grants still out, named by the newest of them)
--                 2: lease still live (this and every later member of the index: stop here)
--                 0: stale, removed from the index
-- (The prelude's `index` and `save` are not used: this script writes nothing but ZREM.)
local out = { NOW, 'unresolved', #ARGV }
for i, member in ipairs(ARGV) do
  local rec = load(KEYS[i + 1])
  if rec and rec[STATE] == AUTHORIZED and NOW >= rec[LEASE_END] then
    table.insert(out, 1)
    table.insert(out, rec[FENCING])
    table.insert(out, rec[FINGERPRINT])
    table.insert(out, rec[LEASE_END])
    table.insert(out, rec[HOLDER])
    table.insert(out, rec[TOKEN])
    table.insert(out, rec[ASKED_ACTION] or '')
    table.insert(out, rec[ASKED_PARAMS] or '')
  elseif rec and rec[STATE] == RELEASED and #rec[OLDER] > 0 then
    -- superseded grants still out: unresolved, named by the newest of them
    table.insert(out, 1)
    table.insert(out, rec[OLDER][#rec[OLDER]][G_FENCING])
    table.insert(out, rec[FINGERPRINT])
    table.insert(out, rec[LEASE_END])
    table.insert(out, '')
    table.insert(out, rec[OLDER][#rec[OLDER]][G_TOKEN])
    table.insert(out, rec[ASKED_ACTION] or '')
    table.insert(out, rec[ASKED_PARAMS] or '')
  elseif rec and rec[STATE] == AUTHORIZED then
    table.insert(out, 2)
    table.insert(out, rec[FENCING])
    table.insert(out, '')
    table.insert(out, rec[LEASE_END])
    table.insert(out, '')
    table.insert(out, '')
    table.insert(out, '')
    table.insert(out, '')
  else
    redis.call('ZREM', KEYS[1], member)
    table.insert(out, 0)
    table.insert(out, 0)
    table.insert(out, '')
    table.insert(out, 0)
    table.insert(out, '')
    table.insert(out, '')
    table.insert(out, '')
    table.insert(out, '')
  end
end
return out
