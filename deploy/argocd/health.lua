-- Argo CD health check for saferollout.dev/SafeRollout.
--
-- Healthy      Ready=True: every node runs the stable revision.
-- Progressing  not reconciled yet (no status, or an older generation
--              observed), rolling a stage, taking over the DaemonSet, or
--              paused (spec.paused, or a stage waiting for approval).
-- Degraded     a revision was reverted and blocked (Degraded=True), or the
--              rollout stalled (Stalled=True, or phase Failed/Degraded).
-- The message is the deciding condition's.
--
-- Argo CD runs custom health checks without Lua's string library: only
-- base, table and (a safe) os are there. Install: deploy/argocd/argocd-cm.yaml.
local hs = {}

local function condition(type_)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == type_ then
      return c
    end
  end
  return nil
end

local function is_true(c)
  return c ~= nil and c.status == "True"
end

local function message_of(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return fallback
end

local function verdict(status, message)
  hs.status = status
  hs.message = message
  return hs
end

if obj.status == nil then
  return verdict("Progressing", "Waiting for the saferollout operator to reconcile the SafeRollout")
end

local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  return verdict("Progressing", "Waiting for the saferollout operator to observe generation " .. generation)
end

local phase = obj.status.phase
local summary = obj.status.message
if summary == nil or summary == "" then
  summary = "phase " .. (phase or "unknown")
end

local stalled = condition("Stalled")
if is_true(stalled) then
  return verdict("Degraded", message_of(stalled, summary))
end
local degraded = condition("Degraded")
if is_true(degraded) then
  return verdict("Degraded", message_of(degraded, summary))
end
local ready = condition("Ready")
if phase == "Failed" or phase == "Degraded" then
  return verdict("Degraded", message_of(ready, summary))
end
if is_true(ready) then
  return verdict("Healthy", message_of(ready, summary))
end
local reconciling = condition("Reconciling")
if is_true(reconciling) then
  return verdict("Progressing", message_of(reconciling, summary))
end
return verdict("Progressing", message_of(condition("Progressing"), message_of(ready, summary)))
