-- GetBudgets: every bucket of one agent, as stored (the gate judges them at `now`).
-- KEYS[1]: the agent's budgets hash, og:{<agent digest>}:budgets
-- Returns: { now, 'budgets', n, then per bucket: id, bucket (MessagePack, the layout in prelude.lua) }
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local all = redis.call('HGETALL', KEYS[1])
local out = { now, 'budgets', #all / 2 }
for _, v in ipairs(all) do
  table.insert(out, v)
end
return out
