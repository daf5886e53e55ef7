--[[
cogpu's cli_filter for Slurm (cli_filter/lua): turns the SPANK option
--gpu-mem=SIZE into the request for the count-only GRES `gpumem`, so that
slurmctld places the job on a node with SIZE of unreserved GPU memory.

Install as cli_filter.lua beside slurm.conf, with CliFilterPlugins=cli_filter/lua.
job_submit.lua does the same in slurmctld, where no client can skip it.
A site that has its own cli_filter.lua calls cogpu_gpu_mem_to_gres(options)
from its slurm_cli_pre_submit instead.

SPANK options are not readable by name from the options table in Slurm
22.05; slurm.json_cli_options() lists them as "spank:NAME".
--]]

function cogpu_gpu_mem_to_gres(options)
  local json = slurm.json_cli_options(options)
  local size = json and string.match(json, '"spank:gpu%-mem":"([^"]*)"')
  if size == nil or size == "" then
    return slurm.SUCCESS
  end
  -- Steps inside an allocation see the job's option too and ask for the
  -- same amount: Slurm gives a step its job's GRES on the node, and on the
  -- node the step joins the job's one reservation. A step that names its
  -- own gpumem count (or --gres=none) keeps it: `--gres=gpumem:0` lets
  -- steps of one job run at once, sharing the job's reservation.
  local step = options["type"] == "srun" and options["jobid"] ~= nil and
               options["jobid"] ~= "" and options["jobid"] ~= "unset"
  -- Slurm counts in binary units like cogpu (30G = 30 GiB); "B" suffixes
  -- and lower case are cogpu's spellings of the same.
  local n, unit = string.match(string.upper(size), "^%s*(%d+)%s*([KMGTP]?)I?B?%s*$")
  if n == nil then
    -- The SPANK plug-in refuses the value with its own message.
    return slurm.SUCCESS
  end
  local gres = options["gres"]
  if step and gres ~= nil and (gres == "none" or string.find(gres, "gpumem:")) then
    return slurm.SUCCESS
  end
  -- A gpumem count the user gave a job as well is replaced: Slurm must
  -- pack by what cogpu reserves.
  local req = "gpumem:" .. n .. unit
  if gres == nil or gres == "" or gres == "none" then
    gres = req
  elseif string.find(gres, "gpumem:") then
    gres = string.gsub(gres, "gpumem:[^,]*", req)
  else
    gres = gres .. "," .. req
  end
  options["gres"] = gres
  return slurm.SUCCESS
end

function slurm_cli_setup_defaults(options, early)
  return slurm.SUCCESS
end

function slurm_cli_pre_submit(options, offset)
  return cogpu_gpu_mem_to_gres(options)
end

function slurm_cli_post_submit(offset, jobid, stepid)
  return slurm.SUCCESS
end
