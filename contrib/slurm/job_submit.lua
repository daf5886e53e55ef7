--[[
cogpu's job_submit for Slurm (JobSubmitPlugins=lua, job_submit.lua beside
slurm.conf). It runs in slurmctld, so no client can skip it: a job
submitted with --gpu-mem=SIZE asks for the count-only GRES `gpumem:SIZE`
per node, and a `gpumem` count the user gave as well is replaced by it,
so that what Slurm packs by is what cogpu reserves on the node.

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
  local req = "gres:gpumem:" .. n .. unit
  local tres = job_desc.tres_per_node
  if tres == nil or tres == "" then
    tres = req
  elseif string.find(tres, "gres:gpumem") then
    tres = string.gsub(tres, "gres:gpumem:[^,]*", req)
  else
    tres = tres .. "," .. req
  end
  job_desc.tres_per_node = tres
  return slurm.SUCCESS
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  return cogpu_gpu_mem_to_gres(job_desc)
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end
