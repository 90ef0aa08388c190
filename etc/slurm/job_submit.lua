--[[
smartmig: submit-time checks for shard jobs (Slurm job_submit/lua plugin).

Slurm accounts MIG capacity in `shard` GRES, one per compute slice (7 per
A100/H100/H200/B200/GB200/B300/GB300, 4 per A30 and RTX PRO 6000, 2 per
RTX PRO 5000), while the node's smartmig sidecar builds MIG
instances. Some counts cannot be built as asked: there is no 5- or 6-slice
profile (`--gres=shard:5` gets a 7g instance), and `--mig-mem`/`--mig-profile`
can need a bigger profile than K slices (A100-40GB: `shard:1 --mig-mem=20G`
gets 3g.20gb). If Slurm billed only K shards, it would place another job on
the slices the instance really takes, and that job would fail on the node.
This script makes Slurm bill what MIG will build, and refuses at submit what
can never run.

For every job with `shard` or `gpu` GRES or smartmig options it:
  - turns a whole-GPU request (`--gres=gpu:1`, `--gpus-per-node=1`) into all
    of one GPU's shards (shard:7 on an A100), served as one whole-GPU MIG
    instance, or refuses it (SMARTMIG_WHOLE_GPU); refuses more than one GPU
    per node, typed MIG devices, --gpus/--gpus-per-task/--gpus-per-socket/
    --tres-per-task GPUs, and --cpus-per-gpu/--mem-per-gpu/--ntasks-per-gpu/
    --gpu-freq with a whole GPU (Slurm would refuse them once it is billed
    as shards), each with a message naming what to ask instead;
  - refuses `shard:0`, more shards than the GPU has compute slices, shards
    requested per job/socket/task (--tres-per-task) instead of per node,
    `--mig-mem` or `--mig-profile` without shards, both options together,
    and a size or profile the partition's GPU model cannot serve;
  - raises K to the compute size of the profile the sidecar will build
    (the smallest profile with >= K slices and >= the `--mig-mem` memory, or
    the `--mig-profile`), rewrites the job's `--gres`, and tells the user once,
    e.g. "smartmig: shard:5 billed as shard:7 (no 5-slice MIG profile on
    a100-40gb)". A memory variant (a profile with more memory slices than
    the default one of its compute size: 1g.10gb on an A100-40GB) blocks
    the shards of a bigger default profile, its `room` (2g.10gb), and is
    billed those: `shard:1 --mig-mem=8G` is billed shard:2 and the sidecar
    builds the 2g.10gb; `--mig-profile=1g.10gb` is billed shard:2 and
    gets the 1g.10gb it asked for. Billed fewer, Slurm would offer a shard
    whose memory is gone.
Jobs without GPUs and without smartmig options, and jobs submitted only to
SMARTMIG_OTHER_PARTITIONS, pass untouched. The same
checks run on `scontrol update` of a pending job's gres or partition
(Slurm drops user messages there; the reason is in slurmctld.log).

Install (see docs/slurm-integration.md, "Submit-time checks"):
  1. copy this file next to slurm.conf as `job_submit.lua`;
  2. set `JobSubmitPlugins=lua` in slurm.conf and restart slurmctld (later
     edits of this file are picked up without a restart: slurmctld re-reads
     it when its modification time changes);
  3. set the GPU model of your shard nodes below.

Every TRES string (tres_per_node/job/socket/task, cpus_per_tres, ...) is
read by one parser, parse_tres, which takes all the spellings Slurm 22.05,
24.11 and 26.05 use: `gres:gpu:1`, `gres/gpu:1`, `gres/gpu=1`, typed
`gpu:a100:1`/`gpu:a100=1`, and other TRES such as `cpu=2` beside them.

Tested with Slurm 22.05 (Debian 12), 24.11 and 26.05, and Lua 5.1. The
smartmig SPANK plugin passes `--mig-mem`/`--mig-profile` to slurmctld as
`_SLURM_SPANK_OPTION_smartmig_mig_mem=VALUE` in the job's spank_job_env
(sbatch, srun, salloc) and, for batch jobs, in the job environment.
]]

------------------------------------------------------------------------------
-- Site settings (edit these)
------------------------------------------------------------------------------

-- GPU model of the nodes with shard GRES, as a smartmig model id (the same
-- ids as `[[gpus]] model` in smartmig.toml): a30-24gb, a100-40gb, a100-80gb,
-- h100-80gb, h100-94gb, h200-141gb, b200-180gb, gb200-186gb, b300-288gb,
-- gb300-288gb, rtx-pro-6000-96gb, rtx-pro-5000-48gb. slurmctld does not know a node's GPU
-- model at submit time, so it is configured here.
local SMARTMIG_DEFAULT_MODEL = "a100-40gb"

-- Partitions whose nodes have another model than the default, e.g.
--   ["a30"] = "a30-24gb",
--   ["h100"] = "h100-80gb",
-- A job submitted to several partitions (-p a,b) must mean the same shard
-- count on all of their models, else it is refused.
local SMARTMIG_PARTITION_MODELS = {
}

-- What a whole-GPU request (--gres=gpu:1, --gpus-per-node=1) means on the
-- partitions of shard nodes: "mig" bills it as all of one GPU's shards
-- (shard:7 on an A100) and smartmig serves it as one whole-GPU MIG instance,
-- isolated like any shard job; "refuse" refuses it with a message naming
-- --gres=shard:7. More than one GPU per node, typed MIG devices
-- (--gres=gpu:3g.20gb:1) and --gpus/--gpus-per-task/--gpus-per-socket/
-- --tres-per-task=gres/gpu:N are refused either way: a job gets one MIG
-- instance per node. (A plain GPU job would get a GPU in MIG mode with no
-- instance of its own, and Slurm 22.05 can run it beside the shard jobs of
-- that GPU.)
local SMARTMIG_WHOLE_GPU = "mig"

-- Partitions whose nodes do not run smartmig (whole GPUs, no shards): jobs
-- submitted only to these pass untouched, e.g. { ["gpu-full"] = true }.
local SMARTMIG_OTHER_PARTITIONS = {
}

------------------------------------------------------------------------------
-- MIG tables: must equal sidecar/mig/src/models.rs (the default profiles;
-- the "+me", "-me", "+gfx", "+me.all" variants are refused by name below).
-- `cargo test -p smartmig-mig lua_tables` fails when they differ and prints
-- the block to paste here. compute and memory
-- are slices, memory_gb is the GB in the profile name, room the default
-- profile whose shards the profile blocks (models.rs room_profile).
------------------------------------------------------------------------------
-- BEGIN SMARTMIG MIG TABLES
local MIG_MODELS = {
    { id = "a30-24gb", compute_slices = 4, memory_slices = 4, memory_gb = 24, profiles = {
        { compute = 1, memory = 1, memory_gb = 6, name = "1g.6gb", room = "1g.6gb" },
        { compute = 2, memory = 2, memory_gb = 12, name = "2g.12gb", room = "2g.12gb" },
        { compute = 4, memory = 4, memory_gb = 24, name = "4g.24gb", room = "4g.24gb" },
    } },
    { id = "a100-40gb", compute_slices = 7, memory_slices = 8, memory_gb = 40, profiles = {
        { compute = 1, memory = 1, memory_gb = 5, name = "1g.5gb", room = "1g.5gb" },
        { compute = 1, memory = 2, memory_gb = 10, name = "1g.10gb", room = "2g.10gb" },
        { compute = 2, memory = 2, memory_gb = 10, name = "2g.10gb", room = "2g.10gb" },
        { compute = 3, memory = 4, memory_gb = 20, name = "3g.20gb", room = "3g.20gb" },
        { compute = 4, memory = 4, memory_gb = 20, name = "4g.20gb", room = "4g.20gb" },
        { compute = 7, memory = 8, memory_gb = 40, name = "7g.40gb", room = "7g.40gb" },
    } },
    { id = "a100-80gb", compute_slices = 7, memory_slices = 8, memory_gb = 80, profiles = {
        { compute = 1, memory = 1, memory_gb = 10, name = "1g.10gb", room = "1g.10gb" },
        { compute = 1, memory = 2, memory_gb = 20, name = "1g.20gb", room = "2g.20gb" },
        { compute = 2, memory = 2, memory_gb = 20, name = "2g.20gb", room = "2g.20gb" },
        { compute = 3, memory = 4, memory_gb = 40, name = "3g.40gb", room = "3g.40gb" },
        { compute = 4, memory = 4, memory_gb = 40, name = "4g.40gb", room = "4g.40gb" },
        { compute = 7, memory = 8, memory_gb = 80, name = "7g.80gb", room = "7g.80gb" },
    } },
    { id = "h100-80gb", compute_slices = 7, memory_slices = 8, memory_gb = 80, profiles = {
        { compute = 1, memory = 1, memory_gb = 10, name = "1g.10gb", room = "1g.10gb" },
        { compute = 1, memory = 2, memory_gb = 20, name = "1g.20gb", room = "2g.20gb" },
        { compute = 2, memory = 2, memory_gb = 20, name = "2g.20gb", room = "2g.20gb" },
        { compute = 3, memory = 4, memory_gb = 40, name = "3g.40gb", room = "3g.40gb" },
        { compute = 4, memory = 4, memory_gb = 40, name = "4g.40gb", room = "4g.40gb" },
        { compute = 7, memory = 8, memory_gb = 80, name = "7g.80gb", room = "7g.80gb" },
    } },
    { id = "h100-94gb", compute_slices = 7, memory_slices = 8, memory_gb = 94, profiles = {
        { compute = 1, memory = 1, memory_gb = 12, name = "1g.12gb", room = "1g.12gb" },
        { compute = 1, memory = 2, memory_gb = 24, name = "1g.24gb", room = "2g.24gb" },
        { compute = 2, memory = 2, memory_gb = 24, name = "2g.24gb", room = "2g.24gb" },
        { compute = 3, memory = 4, memory_gb = 47, name = "3g.47gb", room = "3g.47gb" },
        { compute = 4, memory = 4, memory_gb = 47, name = "4g.47gb", room = "4g.47gb" },
        { compute = 7, memory = 8, memory_gb = 94, name = "7g.94gb", room = "7g.94gb" },
    } },
    { id = "h200-141gb", compute_slices = 7, memory_slices = 8, memory_gb = 141, profiles = {
        { compute = 1, memory = 1, memory_gb = 18, name = "1g.18gb", room = "1g.18gb" },
        { compute = 1, memory = 2, memory_gb = 35, name = "1g.35gb", room = "2g.35gb" },
        { compute = 2, memory = 2, memory_gb = 35, name = "2g.35gb", room = "2g.35gb" },
        { compute = 3, memory = 4, memory_gb = 71, name = "3g.71gb", room = "3g.71gb" },
        { compute = 4, memory = 4, memory_gb = 71, name = "4g.71gb", room = "4g.71gb" },
        { compute = 7, memory = 8, memory_gb = 141, name = "7g.141gb", room = "7g.141gb" },
    } },
    { id = "b200-180gb", compute_slices = 7, memory_slices = 8, memory_gb = 180, profiles = {
        { compute = 1, memory = 1, memory_gb = 23, name = "1g.23gb", room = "1g.23gb" },
        { compute = 1, memory = 2, memory_gb = 45, name = "1g.45gb", room = "2g.45gb" },
        { compute = 2, memory = 2, memory_gb = 45, name = "2g.45gb", room = "2g.45gb" },
        { compute = 3, memory = 4, memory_gb = 90, name = "3g.90gb", room = "3g.90gb" },
        { compute = 4, memory = 4, memory_gb = 90, name = "4g.90gb", room = "4g.90gb" },
        { compute = 7, memory = 8, memory_gb = 180, name = "7g.180gb", room = "7g.180gb" },
    } },
    { id = "gb200-186gb", compute_slices = 7, memory_slices = 8, memory_gb = 186, profiles = {
        { compute = 1, memory = 1, memory_gb = 23, name = "1g.23gb", room = "1g.23gb" },
        { compute = 1, memory = 2, memory_gb = 47, name = "1g.47gb", room = "2g.47gb" },
        { compute = 2, memory = 2, memory_gb = 47, name = "2g.47gb", room = "2g.47gb" },
        { compute = 3, memory = 4, memory_gb = 93, name = "3g.93gb", room = "3g.93gb" },
        { compute = 4, memory = 4, memory_gb = 93, name = "4g.93gb", room = "4g.93gb" },
        { compute = 7, memory = 8, memory_gb = 186, name = "7g.186gb", room = "7g.186gb" },
    } },
    { id = "b300-288gb", compute_slices = 7, memory_slices = 8, memory_gb = 269, profiles = {
        { compute = 1, memory = 1, memory_gb = 34, name = "1g.34gb", room = "1g.34gb" },
        { compute = 1, memory = 2, memory_gb = 67, name = "1g.67gb", room = "2g.67gb" },
        { compute = 2, memory = 2, memory_gb = 67, name = "2g.67gb", room = "2g.67gb" },
        { compute = 3, memory = 4, memory_gb = 135, name = "3g.135gb", room = "3g.135gb" },
        { compute = 4, memory = 4, memory_gb = 135, name = "4g.135gb", room = "4g.135gb" },
        { compute = 7, memory = 8, memory_gb = 269, name = "7g.269gb", room = "7g.269gb" },
    } },
    { id = "gb300-288gb", compute_slices = 7, memory_slices = 8, memory_gb = 278, profiles = {
        { compute = 1, memory = 1, memory_gb = 35, name = "1g.35gb", room = "1g.35gb" },
        { compute = 1, memory = 2, memory_gb = 70, name = "1g.70gb", room = "2g.70gb" },
        { compute = 2, memory = 2, memory_gb = 70, name = "2g.70gb", room = "2g.70gb" },
        { compute = 3, memory = 4, memory_gb = 139, name = "3g.139gb", room = "3g.139gb" },
        { compute = 4, memory = 4, memory_gb = 139, name = "4g.139gb", room = "4g.139gb" },
        { compute = 7, memory = 8, memory_gb = 278, name = "7g.278gb", room = "7g.278gb" },
    } },
    { id = "rtx-pro-6000-96gb", compute_slices = 4, memory_slices = 4, memory_gb = 96, profiles = {
        { compute = 1, memory = 1, memory_gb = 24, name = "1g.24gb", room = "1g.24gb" },
        { compute = 2, memory = 2, memory_gb = 48, name = "2g.48gb", room = "2g.48gb" },
        { compute = 4, memory = 4, memory_gb = 96, name = "4g.96gb", room = "4g.96gb" },
    } },
    { id = "rtx-pro-5000-48gb", compute_slices = 2, memory_slices = 2, memory_gb = 48, profiles = {
        { compute = 1, memory = 1, memory_gb = 24, name = "1g.24gb", room = "1g.24gb" },
        { compute = 2, memory = 2, memory_gb = 48, name = "2g.48gb", room = "2g.48gb" },
    } },
}
-- END SMARTMIG MIG TABLES

------------------------------------------------------------------------------
-- Implementation (mirrors slurm-plugin/src/options.rs and
-- sidecar/mig/src/profile.rs; keep them in step)
------------------------------------------------------------------------------

local MODEL_BY_ID = {}
local MODEL_IDS = {}
for _, m in ipairs(MIG_MODELS) do
    MODEL_BY_ID[m.id] = m
    MODEL_IDS[#MODEL_IDS + 1] = m.id
end

-- A typo in the site settings is reported when slurmctld loads the script
-- (shard jobs are then refused with a message naming the problem).
if SMARTMIG_WHOLE_GPU ~= "mig" and SMARTMIG_WHOLE_GPU ~= "refuse" then
    slurm.log_error("smartmig: job_submit.lua: SMARTMIG_WHOLE_GPU is `%s`; use \"mig\" or \"refuse\" (whole-GPU jobs are refused meanwhile)",
        tostring(SMARTMIG_WHOLE_GPU))
end
if MODEL_BY_ID[SMARTMIG_DEFAULT_MODEL] == nil then
    slurm.log_error("smartmig: job_submit.lua: unknown SMARTMIG_DEFAULT_MODEL `%s` (known: %s)",
        tostring(SMARTMIG_DEFAULT_MODEL), table.concat(MODEL_IDS, ", "))
end
for part, id in pairs(SMARTMIG_PARTITION_MODELS) do
    if MODEL_BY_ID[id] == nil then
        slurm.log_error("smartmig: job_submit.lua: unknown model `%s` for partition %s in SMARTMIG_PARTITION_MODELS (known: %s)",
            tostring(id), tostring(part), table.concat(MODEL_IDS, ", "))
    end
end

-- The names the SPANK plugin's options get in the job's spank_job_env and
-- environment: Slurm's SPANK_OPTION_ENV_PREFIX, the plugin name, the option
-- name with every non-alphanumeric character replaced by '_'.
local OPTION_PREFIX = "_SLURM_SPANK_OPTION_smartmig_"
local OPT_MIG_MEM = OPTION_PREFIX .. "mig_mem"
local OPT_MIG_PROFILE = OPTION_PREFIX .. "mig_profile"
-- Set by the plugin of Slurm before 23.02 in an srun (SRUN_STEP_GRES in
-- slurm-plugin/src/lib.rs): the srun's step asks for its own --gres.
local SRUN_STEP_GRES = "SMARTMIG_SRUN_STEP_GRES"
local SRUN_STEP_GRES_ASKED = "asked"

-- Largest --mig-mem accepted (GB), as MAX_MIG_MEM_GB in options.rs.
local MAX_MIG_MEM_GB = 1024
local MEM_HINT = "expected a size such as 10G, 15GB, 20480M or 40 (GB)"

local function trim(s)
    return (string.gsub(s, "^%s*(.-)%s*$", "%1"))
end

local function split(s, sep_pattern)
    local out = {}
    for part in string.gmatch(s, "[^" .. sep_pattern .. "]+") do
        out[#out + 1] = part
    end
    return out
end

local function profile_names(profiles)
    local names = {}
    for _, p in ipairs(profiles) do
        names[#names + 1] = p.name
    end
    return table.concat(names, ", ")
end

-- GB without a trailing ".0" (20 -> "20", 9.5 -> "9.5").
local function gb_text(gb)
    if gb == math.floor(gb) then
        return string.format("%d", gb)
    end
    return string.format("%.3g", gb)
end

-- --mig-mem value -> GB, or nil and the reason (options.rs parse_mig_mem).
local function parse_mig_mem(value)
    local v = trim(value)
    if v == "" then
        return nil, "--mig-mem needs a value (" .. MEM_HINT .. ")"
    end
    local number, unit = string.match(v, "^([%d%.]*)(.*)$")
    local n = nil
    if string.match(number, "^%d*%.?%d*$") and string.match(number, "%d") then
        n = tonumber(number)
    end
    if n == nil then
        return nil, "--mig-mem=" .. value .. ": not a size (" .. MEM_HINT .. ")"
    end
    unit = string.lower(unit)
    if string.sub(unit, -2) == "ib" then
        unit = string.sub(unit, 1, -3)
    elseif string.sub(unit, -1) == "b" then
        unit = string.sub(unit, 1, -2)
    end
    local factors = { [""] = 1, g = 1, k = 1 / (1024 * 1024), m = 1 / 1024, t = 1024 }
    local factor = factors[unit]
    if factor == nil then
        return nil, "--mig-mem=" .. value .. ": unknown unit (" .. MEM_HINT .. ")"
    end
    local gb = n * factor
    if gb ~= gb or gb == math.huge or gb <= 0 then
        return nil, "--mig-mem=" .. value .. ": must be more than 0 (" .. MEM_HINT .. ")"
    end
    if gb > MAX_MIG_MEM_GB then
        return nil, string.format("--mig-mem=%s: %.0f GB is more than any MIG-capable GPU has",
            value, gb)
    end
    return gb
end

-- (compute, memory GB) out of a profile name such as `3g.20gb`,
-- `nvidia_a100_3g.20gb` or `MIG 1g.10gb+me` (profile.rs split_name).
local function split_name(name)
    local tokens = {}
    for token in string.gmatch(string.lower(trim(name)), "[^_:/%-%s]+") do
        tokens[#tokens + 1] = token
    end
    for i = #tokens, 1, -1 do
        local token = tokens[i]
        if string.sub(token, -3) == "+me" then
            token = string.sub(token, 1, -4)
        end
        local c, m = string.match(token, "^(%+?%d+)g%.(%+?%d+)gb$")
        if c then
            local cn, mn = tonumber(c), tonumber(m)
            if cn <= 255 and mn <= 4294967295 then
                return cn, mn
            end
        end
    end
    return nil
end

-- A profile variant's suffix at the end of a name (`1g.24gb+gfx` -> "+gfx"),
-- or nil (models.rs VariantKind::of_name).
local VARIANT_SUFFIXES = { "+me.all", "+gfx", "-me", "+me" }
local function variant_suffix(name)
    local lower = string.lower(trim(name))
    for _, suffix in ipairs(VARIANT_SUFFIXES) do
        if string.sub(lower, -#suffix) == suffix then
            return suffix
        end
    end
    return nil
end

-- The profile a --mig-profile name means on `model`, or nil and the reason
-- (profile.rs parse_profile: memory may differ by 10 %, at least 1 GB; a
-- variant is refused as requested_profile refuses it).
local function parse_profile(model, name)
    local prefix = "--mig-profile=" .. name .. ": "
    if trim(name) == "" then
        return nil, prefix .. "empty profile name"
    end
    local suffix = variant_suffix(name)
    if suffix ~= nil then
        local base = string.sub(trim(name), 1, -#suffix - 1)
        return nil, string.format("--mig-profile=%s is a `%s` variant; smartmig creates only the default profiles: ask for --mig-profile=%s (docs/user-guide.md, \"Profile variants\")",
            name, suffix, base)
    end
    local compute, memory_gb = split_name(name)
    if compute == nil then
        return nil, prefix .. "`" .. name ..
            "` does not contain a MIG profile of the form `<N>g.<M>gb` (e.g. `3g.20gb`)"
    end
    local same = {}
    for _, p in ipairs(model.profiles) do
        if p.compute == compute then
            same[#same + 1] = p
        end
    end
    if #same == 0 then
        return nil, string.format("%s%s has no profile with %d compute slices (it has %s)",
            prefix, model.id, compute, profile_names(model.profiles))
    end
    local best = nil
    for _, p in ipairs(same) do
        if best == nil or math.abs(p.memory_gb - memory_gb) < math.abs(best.memory_gb - memory_gb) then
            best = p
        end
    end
    local tolerance = math.max(math.floor(best.memory_gb / 10), 1)
    if math.abs(best.memory_gb - memory_gb) > tolerance then
        return nil, string.format("%s%s has no %dg profile with about %d GB (it has %s)",
            prefix, model.id, compute, memory_gb, profile_names(same))
    end
    return best
end

-- The profile the sidecar builds for K slices and `memory_gb` (or nil):
-- the smallest by (compute, memory) with >= K slices and >= that memory
-- (profile.rs select_profile). K is already known to be 1..compute_slices.
local function select_profile(model, slices, memory_gb)
    local candidates = {}
    for _, p in ipairs(model.profiles) do
        if p.compute >= slices then
            candidates[#candidates + 1] = p
        end
    end
    table.sort(candidates, function(a, b)
        if a.compute ~= b.compute then
            return a.compute < b.compute
        end
        return a.memory < b.memory
    end)
    local need = memory_gb or 0
    for _, p in ipairs(candidates) do
        if p.memory_gb >= need then
            return p
        end
    end
    return nil
end

-- The default profile whose room `p` takes (models.rs room_profile): a
-- memory variant such as 1g.10gb on an A100-40GB (1 compute slice, 2 memory
-- slices) blocks the shards of a 2g.10gb, so it is billed those; a default
-- profile is its own room. Slurm counts compute shards only: billed fewer,
-- it would offer a shard whose memory is gone (issue 55).
local function room_of(model, p)
    for _, q in ipairs(model.profiles) do
        if q.name == p.room then
            return q
        end
    end
    return p
end

-- A GRES count as Slurm writes it: digits with an optional k/m/g suffix
-- ("2", "1k"), or nil.
local function parse_count(text)
    local digits, suffix = string.match(text or "", "^(%d+)([kKmMgG]?)$")
    if digits == nil then
        return nil
    end
    local mult = ({ [""] = 1, k = 1024, m = 1024 * 1024, g = 1024 * 1024 * 1024 })[string.lower(suffix)]
    return tonumber(digits) * mult
end

-- THE parser of TRES strings: every tres_per_* field (and cpus_per_tres,
-- mem_per_tres) is read through it. Slurm spells one request in many ways,
-- by series and by option: `gpu:1` and `gres:gpu:1` (22.05), `gres/gpu:1`
-- (23.11+), `gres/gpu=1` (--gpus-per-task and `--gres=gpu=1` on 24.11 and
-- 26.05), typed `gpu:a100:1` and `gpu:a100=1`, no count (`gpu`, one), and
-- other TRES in the same string (`cpu=2` in tres_per_task from 24.11).
-- Returns a list of { index, prefix, name, type, count } (prefix "",
-- "gres:" or "gres/"; count nil when the syntax is not understood here, and
-- Slurm then judges it), plus all entries, trimmed, for rewriting.
local function parse_tres(tres)
    local entries = split(tres or "", ",")
    local parsed = {}
    for i, raw in ipairs(entries) do
        local entry = trim(raw)
        entries[i] = entry
        local prefix, rest = string.match(entry, "^(gres[:/])(.*)$")
        if prefix == nil then
            prefix, rest = "", entry
        end
        local name, tail = string.match(rest, "^([^:=]*)(.*)$")
        local gres_type, count = nil, nil
        if tail == "" or tail == ":" then
            count = 1
        elseif string.sub(tail, 1, 1) == "=" then
            count = parse_count(string.sub(tail, 2))
        else
            local body = string.sub(tail, 2)
            local t, c = string.match(body, "^([^:=]+)=([^=]*)$")
            if t ~= nil then
                -- `gpu:a100=1`
                gres_type, count = t, parse_count(c)
            elseif not string.find(body, "=", 1, true) then
                local parts = split(body, ":")
                local last = parts[#parts]
                count = parse_count(last)
                if count ~= nil then
                    if #parts == 2 then
                        gres_type = parts[1]
                    elseif #parts > 2 then
                        count = nil
                    end
                elseif #parts == 1 then
                    gres_type = last
                    count = 1
                end
            end
        end
        parsed[#parsed + 1] = { index = i, prefix = prefix, name = name, type = gres_type, count = count }
    end
    return parsed, entries
end

-- Entries of GRES `name` in a TRES string (see parse_tres), plus all
-- entries.
local function find_gres(tres, name)
    local parsed, entries = parse_tres(tres)
    local found = {}
    for _, e in ipairs(parsed) do
        if e.name == name then
            found[#found + 1] = e
        end
    end
    return found, entries
end

-- One GRES entry written back, in Slurm's own prefix and `:` separators
-- (`gres/shard:7`, `gres:shard:mig0:7`): every series reads those.
local function gres_entry(found, name, count)
    local text = found.prefix .. name
    if found.type ~= nil then
        text = text .. ":" .. found.type
    end
    return text .. ":" .. string.format("%d", count)
end

local function find_shards(tres)
    return find_gres(tres, "shard")
end

-- A TRES string as users write it in --gres ("gres:gpu:2" -> "gpu:2").
local function gres_text(tres)
    return (string.gsub(tres or "", "gres[:/]", ""))
end

local function shard_text(k)
    return "shard:" .. string.format("%d", k)
end

-- The decision for one GPU model: { k = new K, note = message or nil } or
-- { error = message }.
local function decide(model, k, mig_mem, mig_profile)
    if k == 0 then
        return { error = "--gres=shard:0 asks for no MIG compute slice; ask for at least shard:1" }
    end
    if k > model.compute_slices then
        return { error = string.format(
            "--gres=shard:%d: a GPU has only %d MIG compute slices (%s); ask for shard:%d (or --gres=gpu:1) for a whole GPU as one MIG instance: a job gets one GPU on smartmig nodes",
            k, model.compute_slices, model.id, model.compute_slices) }
    end
    if mig_profile ~= nil then
        local p, err = parse_profile(model, mig_profile)
        if p == nil then
            return { error = err }
        end
        local room = room_of(model, p)
        if room.compute < k then
            return { error = string.format(
                "--mig-profile=%s has %d compute slices but the job asks for shard:%d; use --gres=shard:%d",
                mig_profile, p.compute, k, room.compute) }
        end
        if room.compute > k and room ~= p then
            return { k = room.compute, note = string.format(
                "%s with --mig-profile=%s billed as %s (%s: %s's memory takes the room of a %s; the job gets %s)",
                shard_text(k), mig_profile, shard_text(room.compute), model.id, p.name, room.name, p.name) }
        end
        if room.compute > k then
            return { k = p.compute, note = string.format(
                "%s with --mig-profile=%s billed as %s (%s has %d compute slices)",
                shard_text(k), mig_profile, shard_text(p.compute), p.name, p.compute) }
        end
        return { k = k }
    end
    local memory_gb = nil
    if mig_mem ~= nil then
        local gb, err = parse_mig_mem(mig_mem)
        if gb == nil then
            return { error = err }
        end
        memory_gb = gb
    end
    local p = select_profile(model, k, memory_gb)
    if p == nil then
        return { error = string.format(
            "--mig-mem=%s: %s GB is more than any %s profile with %d or more compute slices has (the largest has %d GB)",
            tostring(mig_mem), gb_text(memory_gb or 0), model.id, k, model.memory_gb) }
    end
    -- A memory variant is billed and built as its room: smartmigd, asked
    -- for the room's slices and the same memory, builds the room.
    local room = room_of(model, p)
    if room.compute == k then
        return { k = k }
    end
    if memory_gb ~= nil and room ~= p then
        return { k = room.compute, note = string.format(
            "%s with --mig-mem=%s billed as %s (%s: %s GB needs %s's memory, which takes the room of a %s; the job gets %s)",
            shard_text(k), mig_mem, shard_text(room.compute), model.id, gb_text(memory_gb), p.name,
            room.name, room.name) }
    end
    if memory_gb ~= nil and select_profile(model, k, nil).compute == k then
        return { k = p.compute, note = string.format(
            "%s with --mig-mem=%s billed as %s (%s: %s GB needs %s)",
            shard_text(k), mig_mem, shard_text(p.compute), model.id, gb_text(memory_gb), p.name) }
    end
    return { k = p.compute, note = string.format(
        "%s billed as %s (no %d-slice MIG profile on %s)",
        shard_text(k), shard_text(p.compute), k, model.id) }
end

-- The value of one variable of a spank_job_env table (nil when absent).
local function spank_value(spank_env, wanted)
    if type(spank_env) ~= "table" then
        return nil
    end
    for _, kv in pairs(spank_env) do
        if type(kv) == "string" then
            local name, value = string.match(kv, "^([^=]+)=(.*)$")
            if name == wanted then
                return value
            end
        end
    end
    return nil
end

-- smartmig option values (mig_mem, mig_profile) from a spank_job_env table
-- (indexed from 0 by Slurm: use pairs) and, for batch jobs, the environment.
local function option_values(spank_env, environment)
    local values = {}
    if type(spank_env) == "table" then
        for _, kv in pairs(spank_env) do
            if type(kv) == "string" then
                local name, value = string.match(kv, "^([^=]+)=(.*)$")
                if name == OPT_MIG_MEM or name == OPT_MIG_PROFILE then
                    values[name] = value
                end
            end
        end
    end
    if environment ~= nil then
        for _, name in ipairs({ OPT_MIG_MEM, OPT_MIG_PROFILE }) do
            if values[name] == nil then
                local value = environment[name]
                if type(value) == "string" then
                    values[name] = value
                end
            end
        end
    end
    -- A value of "(null)" means an option given without argument.
    for name, value in pairs(values) do
        if value == "(null)" then
            values[name] = ""
        end
    end
    return values[OPT_MIG_MEM], values[OPT_MIG_PROFILE]
end

-- The partitions a job names, or the default partition.
local function partition_names(partition, part_list)
    local names = {}
    if partition ~= nil and partition ~= "" then
        names = split(partition, ",")
    elseif type(part_list) == "table" then
        for name, part in pairs(part_list) do
            if part.flag_default == 1 then
                names[#names + 1] = name
            end
        end
    end
    if #names == 0 then
        names = { "(default partition)" }
    end
    return names
end

-- How many of the job's partitions run smartmig, out of how many.
local function smartmig_partitions(partition, part_list)
    local names = partition_names(partition, part_list)
    local n = 0
    for _, name in ipairs(names) do
        if not SMARTMIG_OTHER_PARTITIONS[name] then
            n = n + 1
        end
    end
    return n, #names
end

-- The partitions a job names (or the default partition) and their models:
-- a list of { model = id, partitions = "a,b" } (one per distinct model).
local function models_for(partition, part_list)
    local names = partition_names(partition, part_list)
    local by_model, order = {}, {}
    for _, name in ipairs(names) do
        local id = SMARTMIG_PARTITION_MODELS[name] or SMARTMIG_DEFAULT_MODEL
        if by_model[id] == nil then
            by_model[id] = {}
            order[#order + 1] = id
        end
        table.insert(by_model[id], name)
    end
    local out = {}
    for _, id in ipairs(order) do
        out[#out + 1] = { model = id, partitions = table.concat(by_model[id], ",") }
    end
    return out
end

-- The one GPU model of the job's partitions, or nil and an error result.
local function single_model(job, part_list)
    local model = nil
    for _, entry in ipairs(models_for(job.partition, part_list)) do
        local m = MODEL_BY_ID[entry.model]
        if m == nil then
            return nil, { error = "job_submit.lua names an unknown GPU model `" .. tostring(entry.model) ..
                "` for partition(s) " .. entry.partitions .. "; please tell your Slurm administrator" }
        end
        if model ~= nil and m.compute_slices ~= model.compute_slices then
            return nil, { error = "a whole GPU has " .. model.compute_slices .. " shards on " .. model.id ..
                " but " .. m.compute_slices .. " on " .. m.id .. ": submit to partitions with one GPU model" }
        end
        model = model or m
    end
    return model
end

-- The options that fill each TRES field (names for the messages: the
-- script sees the field, not the option the user typed).
local GPU_OPTIONS = {
    tres_per_job = "--gpus",
    tres_per_socket = "--gpus-per-socket",
    tres_per_task = "--gpus-per-task/--tres-per-task",
}
local SHARD_OPTIONS = {
    tres_per_task = "--tres-per-task",
}

-- "--gpus (tres_per_job=gres/gpu:1)": the option and what Slurm made of it.
local function field_text(options, field, value)
    local opt = options[field]
    if opt == nil then
        return field .. "=" .. tostring(value)
    end
    return opt .. " (" .. field .. "=" .. tostring(value) .. ")"
end

-- What to ask instead of a GPU request this script refuses.
local function whole_gpu_hint()
    if SMARTMIG_WHOLE_GPU == "mig" then
        return "ask --gres=gpu:1 for a whole GPU or --gres=shard:K for K compute slices"
    end
    return "ask --gres=shard:K for K compute slices"
end

-- Options that count per GPU (Slurm's cpus_per_tres, mem_per_tres,
-- ntasks_per_tres, tres_freq). Once a whole GPU is billed as shards the job
-- has no `gpu` left for them to count by, and Slurm refuses the job with
-- "Invalid generic resource (gres) specification": refuse it first, naming
-- the option and its per-node equivalent (a job has one GPU per node).
-- nil or { error = msg }.
local function per_gpu_options(job, whole)
    local billed = "on smartmig nodes a whole GPU is billed as " .. whole ..
        " (one MIG instance), so Slurm has no GPU to count it by"
    local cpus = find_gres(job.cpus_per_tres, "gpu")
    if #cpus > 0 then
        local n = cpus[1].count and string.format("%d", cpus[1].count) or "N"
        return { error = string.format(
            "--cpus-per-gpu=%s (cpus_per_tres=%s): %s; ask --mincpus=%s (CPUs per node) or --cpus-per-task=%s (-c, per task) with --gres=gpu:1 instead",
            n, job.cpus_per_tres, billed, n, n) }
    end
    local mem = find_gres(job.mem_per_tres, "gpu")
    if #mem > 0 then
        local n = mem[1].count and string.format("%dM", mem[1].count) or "SIZE"
        return { error = string.format(
            "--mem-per-gpu=%s (mem_per_tres=%s): %s; ask --mem=%s with --gres=gpu:1 instead",
            n, job.mem_per_tres, billed, n) }
    end
    local ntasks = tonumber(job.ntasks_per_tres)
    if ntasks ~= nil and ntasks > 0 and ntasks < 65534 then
        return { error = string.format(
            "--ntasks-per-gpu=%d: %s; ask --ntasks-per-node=%d with --gres=gpu:1 instead",
            ntasks, billed, ntasks) }
    end
    if type(job.tres_freq) == "string" and string.find(job.tres_freq, "gpu", 1, true) then
        return { error = string.format(
            "--gpu-freq (tres_freq=%s): on smartmig nodes a whole GPU is billed as %s (one MIG instance), and Slurm takes --gpu-freq only with GPUs billed as gpu; submit without --gpu-freq",
            job.tres_freq, whole) }
    end
    return nil
end

-- Whole-GPU requests on smartmig nodes (SMARTMIG_WHOLE_GPU): nil when the
-- job asks for no `gpu` GRES, else { error = msg } or { tres_per_node =
-- new, note = msg } with the gpu entry rewritten to the GPU's shards.
local function whole_gpu(job, part_list)
    for _, field in ipairs({ "tres_per_job", "tres_per_socket", "tres_per_task" }) do
        if #find_gres(job[field], "gpu") > 0 then
            return { error = string.format(
                "%s: on smartmig nodes a job gets one GPU, as one MIG instance, per node; %s",
                field_text(GPU_OPTIONS, field, job[field]), whole_gpu_hint()) }
        end
    end
    local gpus, entries = find_gres(job.tres_per_node, "gpu")
    if #gpus == 0 then
        return nil
    end
    if #gpus > 1 or #find_shards(job.tres_per_node) > 0 then
        return { error = "--gres=" .. gres_text(job.tres_per_node) ..
            ": ask for either --gres=gpu:1 (a whole GPU) or --gres=shard:K (K compute slices), once" }
    end
    local gpu = gpus[1]
    local c = gpu.type and split_name(gpu.type)
    if c ~= nil then
        return { error = string.format(
            "--gres=gpu:%s asks for a MIG device type; on smartmig nodes ask --gres=%s --mig-profile=%s",
            gpu.type, shard_text(c), gpu.type) }
    end
    local model, err = single_model(job, part_list)
    if model == nil then
        return err
    end
    local whole = shard_text(model.compute_slices)
    if gpu.count ~= 1 then
        return { error = string.format(
            "--gres=%s: on smartmig nodes a job gets one GPU per node, as one MIG instance; ask --gres=gpu:1 (billed as %s) for a whole GPU, or submit multi-GPU jobs to a partition without smartmig",
            gres_text(job.tres_per_node), whole) }
    end
    if SMARTMIG_WHOLE_GPU ~= "mig" then
        return { error = string.format(
            "whole-GPU jobs (--gres=gpu:1) are not taken on smartmig nodes here; ask --gres=%s for a whole %s as one MIG instance",
            whole, model.id) }
    end
    local refused = per_gpu_options(job, whole)
    if refused ~= nil then
        return refused
    end
    entries[gpu.index] = gres_entry(gpu, "shard", model.compute_slices)
    local full = nil
    for _, p in ipairs(model.profiles) do
        if p.compute == model.compute_slices and (full == nil or p.memory > full.memory) then
            full = p
        end
    end
    if job.srun_step_gres == SRUN_STEP_GRES_ASKED then
        -- srun before Slurm 23.02 asks its first step for its own --gres
        -- (gpu:1), which the job billed as shards no longer has: Slurm would
        -- grant the job and then refuse the step ("Step requested GRES
        -- (gpu:(null)) not found in the job"). salloc's steps ask nothing
        -- and get the job's shards.
        return { error = string.format(
            "srun --gres=%s cannot start on this Slurm (before 23.02): it would be billed as %s, but srun asks its step for the GPU itself, which Slurm then refuses; ask srun --gres=%s (a whole %s as one %s MIG instance), or salloc --gres=gpu:1 and srun without --gres inside it",
            gres_text(job.tres_per_node), whole, whole, model.id, full.name) }
    end
    return { tres_per_node = table.concat(entries, ","), note = string.format(
        "--gres=%s billed as %s: a whole %s as one %s MIG instance (smartmig node)",
        gres_text(job.tres_per_node), gres_text(entries[gpu.index]), model.id, full.name) }
end

-- The shard check. `job` has tres_per_node, tres_per_job, tres_per_socket,
-- tres_per_task, cpus_per_tres, mem_per_tres, ntasks_per_tres, tres_freq,
-- partition, mig_mem, mig_profile. Returns nil (pass untouched), or
-- { error = msg }, or { tres_per_node = new, notes = {...} }.
local function check_shards(job, part_list)
    local shards, entries = find_shards(job.tres_per_node)
    for _, field in ipairs({ "tres_per_job", "tres_per_socket", "tres_per_task" }) do
        if #find_shards(job[field]) > 0 then
            return { error = string.format(
                "shards must be requested per node with --gres=shard:K (one MIG instance per node), not with %s",
                field_text(SHARD_OPTIONS, field, job[field])) }
        end
    end
    if #shards == 0 then
        if job.mig_profile ~= nil then
            local hint = "--gres=shard:K"
            local c = split_name(job.mig_profile)
            if c ~= nil then
                hint = "--gres=" .. shard_text(c)
            end
            return { error = "--mig-profile needs --gres=shard:K (e.g. " .. hint ..
                " --mig-profile=" .. job.mig_profile .. "); without shards the job gets no MIG instance" }
        end
        if job.mig_mem ~= nil then
            return { error = "--mig-mem needs --gres=shard:K (K MIG compute slices, e.g. --gres=shard:1 --mig-mem=" ..
                job.mig_mem .. "); without shards the job gets no MIG instance" }
        end
        return nil
    end
    if #shards > 1 then
        return { error = "shards requested more than once in --gres (" .. job.tres_per_node .. "); ask for --gres=shard:K once" }
    end
    local shard = shards[1]
    if shard.count == nil then
        -- A form this script does not know: Slurm validates it.
        return nil
    end
    if job.mig_mem ~= nil and job.mig_profile ~= nil then
        return { error = "use either --mig-mem or --mig-profile, not both (a profile fixes the memory)" }
    end
    local k = shard.count
    local decisions = {}
    for _, entry in ipairs(models_for(job.partition, part_list)) do
        local model = MODEL_BY_ID[entry.model]
        if model == nil then
            slurm.log_error("smartmig: job_submit.lua: unknown GPU model `%s` for partition(s) %s (known: %s); fix SMARTMIG_DEFAULT_MODEL/SMARTMIG_PARTITION_MODELS",
                tostring(entry.model), entry.partitions, table.concat(MODEL_IDS, ", "))
            return { error = "job_submit.lua names an unknown GPU model `" .. tostring(entry.model) ..
                "` for partition(s) " .. entry.partitions .. "; please tell your Slurm administrator" }
        end
        local d = decide(model, k, job.mig_mem, job.mig_profile)
        d.model = model.id
        d.partitions = entry.partitions
        if d.error ~= nil then
            return d
        end
        decisions[#decisions + 1] = d
    end
    local first = decisions[1]
    for _, d in ipairs(decisions) do
        if d.k ~= first.k then
            local asked = shard_text(k)
            if job.mig_mem ~= nil then
                asked = asked .. " with --mig-mem=" .. job.mig_mem
            elseif job.mig_profile ~= nil then
                asked = asked .. " with --mig-profile=" .. job.mig_profile
            end
            return { error = string.format(
                "%s means %s on %s (partition %s) but %s on %s (partition %s): submit to partitions with one GPU model",
                asked, shard_text(first.k), first.model, first.partitions,
                shard_text(d.k), d.model, d.partitions) }
        end
    end
    if first.k == k then
        return nil
    end
    entries[shard.index] = gres_entry(shard, "shard", first.k)
    return { tres_per_node = table.concat(entries, ","), notes = { first.note } }
end

-- The whole check (see check_shards for `job`): whole-GPU requests, then
-- shards.
local function check(job, part_list)
    local smartmig, named = smartmig_partitions(job.partition, part_list)
    if smartmig == 0 then
        return nil
    end
    local gpu_note = nil
    local whole = whole_gpu(job, part_list)
    if whole ~= nil then
        if whole.error ~= nil then
            return whole
        end
        if smartmig < named then
            return { error = "a GPU job cannot list partitions with and without smartmig (-p " ..
                tostring(job.partition) .. "): a GPU means a MIG instance on one and a whole GPU on the other" }
        end
        local rewritten = {}
        for k, v in pairs(job) do
            rewritten[k] = v
        end
        rewritten.tres_per_node = whole.tres_per_node
        job = rewritten
        gpu_note = whole.note
    end
    local result = check_shards(job, part_list)
    if gpu_note == nil then
        return result
    end
    if result == nil then
        return { tres_per_node = job.tres_per_node, notes = { gpu_note } }
    end
    if result.error == nil then
        table.insert(result.notes, 1, gpu_note)
    end
    return result
end

local function submit(job_desc, part_list)
    local environment = nil
    if job_desc.script ~= nil then
        -- Only batch jobs carry their environment to slurmctld (reading it
        -- for others makes Slurm log a complaint).
        environment = job_desc.environment
    end
    local mig_mem, mig_profile = option_values(job_desc.spank_job_env, environment)
    local job = {
        tres_per_node = job_desc.tres_per_node,
        tres_per_job = job_desc.tres_per_job,
        tres_per_socket = job_desc.tres_per_socket,
        tres_per_task = job_desc.tres_per_task,
        cpus_per_tres = job_desc.cpus_per_tres,
        mem_per_tres = job_desc.mem_per_tres,
        ntasks_per_tres = job_desc.ntasks_per_tres,
        tres_freq = job_desc.tres_freq,
        partition = job_desc.partition,
        mig_mem = mig_mem,
        mig_profile = mig_profile,
        srun_step_gres = spank_value(job_desc.spank_job_env, SRUN_STEP_GRES),
    }
    local result = check(job, part_list)
    if result == nil then
        return slurm.SUCCESS
    end
    local who = string.format("uid %s job name %s", tostring(job_desc.user_id), tostring(job_desc.name))
    if result.error ~= nil then
        slurm.log_info("smartmig: refused a job of %s: %s", who, result.error)
        slurm.log_user("smartmig: %s", result.error)
        return slurm.ERROR
    end
    slurm.log_info("smartmig: job of %s: tres_per_node %s -> %s", who, tostring(job.tres_per_node), result.tres_per_node)
    job_desc.tres_per_node = result.tres_per_node
    for _, note in ipairs(result.notes) do
        if note ~= nil then
            slurm.log_user("smartmig: %s", note)
        end
    end
    return slurm.SUCCESS
end

local function modify(job_desc, job_rec, part_list)
    -- Only a change of the shard request or the partition can change what
    -- MIG builds (the options cannot be changed after submission).
    if job_desc.tres_per_node == nil and job_desc.partition == nil then
        return slurm.SUCCESS
    end
    local mig_mem, mig_profile = option_values(job_rec.spank_job_env, nil)
    local job = {
        tres_per_node = job_desc.tres_per_node or job_rec.tres_per_node,
        tres_per_job = job_desc.tres_per_job,
        tres_per_socket = job_desc.tres_per_socket,
        tres_per_task = job_desc.tres_per_task,
        cpus_per_tres = job_desc.cpus_per_tres,
        mem_per_tres = job_desc.mem_per_tres,
        ntasks_per_tres = job_desc.ntasks_per_tres,
        tres_freq = job_desc.tres_freq,
        partition = job_desc.partition or job_rec.partition,
        mig_mem = mig_mem,
        mig_profile = mig_profile,
    }
    if #find_shards(job.tres_per_node) == 0 and #find_gres(job.tres_per_node, "gpu") == 0 then
        -- Removing the GPUs of a job is the user's business.
        return slurm.SUCCESS
    end
    local result = check(job, part_list)
    if result == nil then
        return slurm.SUCCESS
    end
    if result.error ~= nil then
        -- Slurm 22.05 discards user messages of job_modify: log it.
        slurm.log_info("smartmig: refused update of job %s: %s", tostring(job_rec.job_id), result.error)
        return slurm.ERROR
    end
    slurm.log_info("smartmig: update of job %s: tres_per_node %s -> %s (%s)", tostring(job_rec.job_id),
        tostring(job.tres_per_node), result.tres_per_node, tostring(result.notes[1]))
    job_desc.tres_per_node = result.tres_per_node
    return slurm.SUCCESS
end

-- Entry points called by slurmctld. An internal error lets the job pass
-- unchanged (as Slurm itself does when a script fails) and is logged.
function slurm_job_submit(job_desc, part_list, submit_uid)
    local ok, rc = pcall(submit, job_desc, part_list)
    if not ok then
        slurm.log_error("smartmig: job_submit.lua failed, job passed unchecked: %s", tostring(rc))
        return slurm.SUCCESS
    end
    return rc
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    local ok, rc = pcall(modify, job_desc, job_rec, part_list)
    if not ok then
        slurm.log_error("smartmig: job_submit.lua failed, update passed unchecked: %s", tostring(rc))
        return slurm.SUCCESS
    end
    return rc
end

return slurm.SUCCESS
