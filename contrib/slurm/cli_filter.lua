--[[
cogpu's cli_filter for Slurm (cli_filter/lua): turns the SPANK option
--gpu-mem=SIZE into the request for the count-only GRES `cogpumem`, so
that slurmctld places the job on a node with SIZE of unreserved GPU
memory.

Install as cli_filter.lua beside slurm.conf, with CliFilterPlugins=cli_filter/lua.
job_submit.lua does the same in slurmctld, where no client can skip it.
A site that has its own cli_filter.lua calls cogpu_gpu_mem_to_gres(options)
from its slurm_cli_pre_submit instead.

The GRES was named `gpumem` before cogpu 0.2; Slurm 23.02 and later use
that name for a TRES of their own. A slurm.conf that still declares
`gpumem` in GresTypes keeps working until cogpu 0.3 (the SPANK plug-in
warns the user, job_submit.lua the admin). Where slurm.conf cannot be read
(a configless client), the new name is used.

SPANK options are not readable by name from the options table in Slurm
22.05; slurm.json_cli_options() lists them as "spank:NAME".
--]]

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

-- The GRES list without counts of cogpu's GRES (either name); and the
-- count the list gave, if any. Slurm 22.05 hands the list over with each
-- item as "gres:NAME:COUNT".
local function cogpu_strip(gres)
  local out, given = {}, nil
  for item in string.gmatch(gres or "", "[^,]+") do
    local name, count = string.match(string.gsub(item, "^gres:", ""),
                                     "^([%w_]+):?(.*)$")
    if name == "cogpumem" or name == "gpumem" then
      given = count
    else
      table.insert(out, item)
    end
  end
  return table.concat(out, ","), given
end

function cogpu_gpu_mem_to_gres(options)
  local json = slurm.json_cli_options(options)
  local size = json and string.match(json, '"spank:gpu%-mem":"([^"]*)"')
  if size == nil or size == "" then
    return slurm.SUCCESS
  end
  -- Steps inside an allocation see the job's option too and ask for the
  -- same amount: Slurm gives a step its job's GRES on the node, and on the
  -- node the step joins the job's one reservation. A step that names its
  -- own count (or --gres=none) keeps it: `--gres=cogpumem:0` lets steps
  -- of one job run at once, sharing the job's reservation.
  local step = options["type"] == "srun" and options["jobid"] ~= nil and
               options["jobid"] ~= "" and options["jobid"] ~= "unset"
  -- Slurm counts in binary units like cogpu (30G = 30 GiB); "B" suffixes
  -- and lower case are cogpu's spellings of the same.
  local n, unit = string.match(string.upper(size), "^%s*(%d+)%s*([KMGTP]?)I?B?%s*$")
  if n == nil then
    -- The SPANK plug-in refuses the value with its own message.
    return slurm.SUCCESS
  end
  local name = cogpu_gres_name()
  local gres = options["gres"]
  if gres == "none" then
    if step then
      return slurm.SUCCESS
    end
    gres = nil
  end
  local rest, given = cogpu_strip(gres)
  if step and given ~= nil then
    -- The step's own count, under the cluster's name for the GRES.
    n, unit = given, ""
  end
  -- A count the user gave a job as well is replaced: Slurm must pack by
  -- what cogpu reserves.
  local req = name .. ":" .. n .. unit
  if gres ~= nil and string.sub(gres, 1, 5) == "gres:" then
    req = "gres:" .. req
  end
  if rest == "" then
    options["gres"] = req
  else
    options["gres"] = rest .. "," .. req
  end
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
