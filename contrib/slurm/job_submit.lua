--[[
cogpu's job_submit for Slurm (JobSubmitPlugins=lua, job_submit.lua beside
slurm.conf). It runs in slurmctld, so no client can skip it: a job
submitted with --gpu-mem=SIZE asks for the count-only GRES `cogpumem:SIZE`
per node, and a count the user gave as well is replaced by it, so that
what Slurm packs by is what cogpu reserves on the node.

The GRES was named `gpumem` before cogpu 0.2. Slurm 23.02 and later use
`gres/gpumem` for a TRES of their own (GPU memory sampled through NVML,
with AccountingStorageTRES=gres/gpu), so cogpu's count now has a name no
Slurm version uses. A cluster whose slurm.conf still declares
`GresTypes=...,gpumem` keeps working, with a warning in slurmctld's log,
until cogpu 0.3.

cli_filter.lua does the same on the client; a site may use either or both.
A site with its own job_submit.lua calls cogpu_gpu_mem_to_gres(job_desc)
from its slurm_job_submit.
--]]

-- The --gpu-mem value the SPANK plug-in (named cogpu) forwarded.
local function cogpu_gpu_mem(job_desc)
  local env = job_desc.spank_job_env
  if type(env) ~= "table" then
    return nil
  end
  for _, v in pairs(env) do
    local m = string.match(v, "^_SLURM_SPANK_OPTION_cogpu_gpu_mem=(.*)$")
    if m then
      return m
    end
  end
  return nil
end

-- The name slurm.conf's GresTypes gives cogpu's GRES: "cogpumem", or the
-- old "gpumem" where the cluster has not been renamed yet.
local function cogpu_gres_name()
  local f = io.open(os.getenv("SLURM_CONF") or "/etc/slurm/slurm.conf", "r")
  if f == nil then
    return "cogpumem"
  end
  local name = "cogpumem"
  for line in f:lines() do
    local types = string.match(string.lower(line), "^%s*grestypes%s*=%s*([^#%s]*)")
    if types then
      local list = "," .. types .. ","
      if not string.find(list, ",cogpumem,", 1, true) and
         string.find(list, ",gpumem,", 1, true) then
        name = "gpumem"
      end
    end
  end
  f:close()
  return name
end

local cogpu_warned = false

function cogpu_gpu_mem_to_gres(job_desc)
  local size = cogpu_gpu_mem(job_desc)
  if size == nil or size == "" then
    return slurm.SUCCESS
  end
  -- Binary units, as in Slurm's counts (30G = 30 GiB).
  local n, unit = string.match(string.upper(size),
                               "^%s*(%d+)%s*([KMGTP]?)I?B?%s*$")
  if n == nil then
    slurm.log_user("cogpu: invalid --gpu-mem '%s'", size)
    return slurm.ERROR
  end
  local name = cogpu_gres_name()
  if name == "gpumem" and not cogpu_warned then
    cogpu_warned = true
    slurm.log_info("cogpu: slurm.conf declares cogpu's GRES as `gpumem`, " ..
                   "which Slurm 23.02 and later use for their own TRES; " ..
                   "rename it `cogpumem` (GresTypes, the nodes' Gres=, " ..
                   "gres.conf): the old name works until cogpu 0.3")
  end
  -- Every count of either name is replaced: Slurm must pack by what cogpu
  -- reserves. TresPerNode items read "gres:NAME:COUNT" (22.05) or
  -- "gres/NAME:COUNT" (later versions).
  local tres = job_desc.tres_per_node or ""
  local sep = string.find(tres, "gres/", 1, true) and "/" or ":"
  local out = {}
  for item in string.gmatch(tres, "[^,]+") do
    local gres = string.match(item, "^gres[:/]([%w_]+)")
    if gres ~= "cogpumem" and gres ~= "gpumem" then
      table.insert(out, item)
    end
  end
  table.insert(out, "gres" .. sep .. name .. ":" .. n .. unit)
  job_desc.tres_per_node = table.concat(out, ",")
  return slurm.SUCCESS
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  return cogpu_gpu_mem_to_gres(job_desc)
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end
