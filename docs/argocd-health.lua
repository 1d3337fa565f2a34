-- Argo CD health check for specdec.io/SpeculativeServer.
-- Register it under `resource.customizations.health.specdec.io_SpeculativeServer` in argocd-cm
-- (docs/install.md, "Argo CD"). Argo CD runs it with the live object in `obj` and expects {status, message}.
--
--   Healthy      Promoted (the speculative server serves; Ready not False), or
--                RolledBack with Ready=True (the base server serves; the reason is in the message)
--   Progressing  no status yet, a spec change not yet observed, Pending/Validating/Deploying/Probing,
--                RolledBack while the base server is not Ready yet, or a decided resource whose stable
--                Service is still being created (Ready=False, reason ServicePending)
--   Degraded     Invalid (the drafter cannot serve with the target), Failed, a Promoted or RolledBack server
--                whose Ready condition is False
--   Unknown      a phase this script does not know (a newer operator)
--
-- tests/unit/test_argocd_health.py runs this file in a real Lua runtime (lupa) against sample objects.

local hs = {}

local function condition(status, kind)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

-- "Reason: message", or whichever of the two exists, or the fallback.
local function describe(status, fallback)
  local reason = status.reason
  local message = status.message
  if reason ~= nil and reason ~= "" and message ~= nil and message ~= "" then
    return reason .. ": " .. message
  end
  if message ~= nil and message ~= "" then
    return message
  end
  if reason ~= nil and reason ~= "" then
    return reason
  end
  return fallback
end

local status = obj.status
if status == nil or status.phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to pick up this SpeculativeServer"
  return hs
end

-- A spec change the operator has not seen yet: whatever the phase says is about the previous generation.
local generation = obj.metadata ~= nil and obj.metadata.generation or nil
if generation ~= nil and status.observedGeneration ~= nil and status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end

local phase = status.phase
local ready = condition(status, "Ready")
local readyStatus = ready ~= nil and ready.status or nil

-- The operator creates the stable Service beside its steps; under load it can trail the decision by seconds.
if (phase == "Promoted" or phase == "RolledBack") and readyStatus == "False" and ready.reason == "ServicePending" then
  hs.status = "Progressing"
  hs.message = phase .. ", waiting for the stable Service: " .. ((ready.message ~= nil and ready.message ~= "") and ready.message or "being created")
  return hs
end

if phase == "Promoted" then
  if readyStatus == "False" then
    hs.status = "Degraded"
    hs.message = "Promoted, but not Ready: " .. ((ready.message ~= nil and ready.message ~= "") and ready.message or (ready.reason or "no reason given"))
  else
    hs.status = "Healthy"
    local speedup = status.speedup ~= nil and string.format(" (speedup %.2fx)", status.speedup) or ""
    hs.message = "Promoted: the speculative server serves" .. speedup
  end
  return hs
end

if phase == "RolledBack" then
  if readyStatus == "True" then
    hs.status = "Healthy"
    hs.message = "Rolled back, the base server serves: " .. describe(status, "no reason recorded")
  elseif readyStatus == "False" then
    hs.status = "Degraded"
    hs.message = "Rolled back and the base server is not Ready: " .. ((ready.message ~= nil and ready.message ~= "") and ready.message or describe(status, "no reason recorded"))
  else
    hs.status = "Progressing"
    hs.message = "Rolled back, waiting for the base server to be Ready: " .. describe(status, "no reason recorded")
  end
  return hs
end

if phase == "Pending" or phase == "Validating" or phase == "Deploying" or phase == "Probing" then
  hs.status = "Progressing"
  hs.message = phase .. ": " .. describe(status, "in progress")
  return hs
end

if phase == "Invalid" or phase == "Failed" then
  hs.status = "Degraded"
  hs.message = phase .. ": " .. describe(status, "no reason recorded")
  return hs
end

hs.status = "Unknown"
hs.message = "Unknown phase " .. tostring(phase)
return hs
