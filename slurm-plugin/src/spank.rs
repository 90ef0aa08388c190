//! Safe wrappers over the few SPANK calls the plugin makes.
//!
//! Every function takes the raw handle Slurm passed to the callback and
//! turns SPANK error codes into `Option`/`Result`; nothing here panics on
//! what Slurm returns.

use std::ffi::{c_char, c_int, CStr, CString};

use crate::sys;

/// A SPANK call that failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpankError {
    /// A variable name with a NUL byte cannot be passed to C.
    #[error("{name}: NUL in name")]
    NulInName { name: String },
    /// A value with a NUL byte cannot be passed to C.
    #[error("{name}: NUL in value")]
    NulInValue { name: String },
    #[error("spank_setenv({name}) failed with SPANK error {code}")]
    Setenv {
        name: String,
        code: sys::spank_err_t,
    },
    #[error("spank_job_control_setenv({name}) failed with SPANK error {code}")]
    JobControlSetenv {
        name: String,
        code: sys::spank_err_t,
    },
    #[error("spank_option_register(--{option}) failed with SPANK error {code}")]
    RegisterOption {
        option: String,
        code: sys::spank_err_t,
    },
}

/// The SPANK context the plugin runs in (`spank_context()`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Context {
    /// srun on the submit host.
    Local,
    /// slurmstepd on the compute node (the job step).
    Remote,
    /// sbatch/salloc on the submit host.
    Allocator,
    /// slurmd itself.
    Slurmd,
    /// The job prolog/epilog run by slurmd.
    JobScript,
    /// Anything else (`S_CTX_ERROR`, a future value).
    Other,
}

/// The current context.
pub fn context() -> Context {
    // SAFETY: spank_context takes no arguments and is provided by every
    // process that loads SPANK plugins.
    let ctx = unsafe { sys::spank_context() };
    match ctx {
        sys::spank_context_S_CTX_LOCAL => Context::Local,
        sys::spank_context_S_CTX_REMOTE => Context::Remote,
        sys::spank_context_S_CTX_ALLOCATOR => Context::Allocator,
        sys::spank_context_S_CTX_SLURMD => Context::Slurmd,
        sys::spank_context_S_CTX_JOB_SCRIPT => Context::JobScript,
        _ => Context::Other,
    }
}

/// The plugstack.conf words of this plugin (`ac`, `av`). Non-UTF-8 bytes
/// are replaced; a null `av` yields no words.
///
/// # Safety
/// `av` must point to `ac` valid NUL-terminated strings (or be null).
pub unsafe fn args(ac: c_int, av: *mut *mut c_char) -> Vec<String> {
    if av.is_null() || ac <= 0 {
        return Vec::new();
    }
    (0..ac as usize)
        .filter_map(|i| {
            // SAFETY: caller guarantees `ac` entries.
            let p = unsafe { *av.add(i) };
            (!p.is_null()).then(|| {
                // SAFETY: non-null, NUL-terminated by the caller's contract.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            })
        })
        .collect()
}

/// A `u32` item (`S_JOB_ID`, `S_JOB_STEPID`, `S_JOB_UID`).
///
/// # Safety
/// `sp` must be the handle of the current callback.
pub unsafe fn item_u32(sp: sys::spank_t, item: sys::spank_item_t) -> Option<u32> {
    let mut value: u32 = 0;
    // SAFETY: these items write one uint32_t / uid_t (both 32-bit) through
    // the pointer.
    let rc = unsafe { sys::spank_get_item(sp, item, &mut value as *mut u32) };
    (rc == sys::ESPANK_SUCCESS as sys::spank_err_t).then_some(value)
}

/// The running Slurm's version as it spells it (`S_SLURM_VERSION`, e.g.
/// "22.05.8"); valid in every context. `None` when Slurm does not say.
///
/// # Safety
/// `sp` must be the handle of the current callback.
pub unsafe fn slurm_version(sp: sys::spank_t) -> Option<String> {
    let mut text: *const c_char = std::ptr::null();
    // SAFETY: S_SLURM_VERSION writes one `char *` (a static string Slurm
    // owns, not to be freed) through the pointer.
    let rc = unsafe {
        sys::spank_get_item(
            sp,
            sys::spank_item_S_SLURM_VERSION,
            &mut text as *mut *const c_char,
        )
    };
    if rc != sys::ESPANK_SUCCESS as sys::spank_err_t || text.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated (a C string constant of Slurm).
    Some(
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// A variable of the job step's environment (`spank_getenv`), remote
/// context only; `None` when unset or not available here.
///
/// # Safety
/// `sp` must be the handle of the current callback.
pub unsafe fn getenv(sp: sys::spank_t, name: &str) -> Option<String> {
    let cname = CString::new(name).ok()?;
    let mut size = 256usize;
    // Values longer than 64 KiB are not what this plugin reads.
    while size <= 64 * 1024 {
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` has `size` writable bytes; spank_getenv NUL-terminates.
        let rc = unsafe {
            sys::spank_getenv(
                sp,
                cname.as_ptr(),
                buf.as_mut_ptr().cast::<c_char>(),
                size as c_int,
            )
        };
        if rc == sys::ESPANK_SUCCESS as sys::spank_err_t {
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            return Some(String::from_utf8_lossy(&buf[..end]).into_owned());
        }
        if rc != sys::slurm_err_t_ESPANK_NOSPACE as sys::spank_err_t {
            return None;
        }
        size *= 4;
    }
    None
}

/// `name` and `value` as C strings, or the error naming the variable
/// whose name or value holds a NUL byte.
fn c_strings(name: &str, value: &str) -> Result<(CString, CString), SpankError> {
    let cname = CString::new(name).map_err(|_| SpankError::NulInName {
        name: name.to_string(),
    })?;
    let cvalue = CString::new(value).map_err(|_| SpankError::NulInValue {
        name: name.to_string(),
    })?;
    Ok((cname, cvalue))
}

/// Sets a variable in the job step's environment (`spank_setenv`, remote
/// context only). A failure carries the SPANK error code.
///
/// # Safety
/// `sp` must be the handle of the current callback.
pub unsafe fn setenv(sp: sys::spank_t, name: &str, value: &str) -> Result<(), SpankError> {
    let (cname, cvalue) = c_strings(name, value)?;
    // SAFETY: both strings are NUL-terminated and outlive the call.
    let rc = unsafe { sys::spank_setenv(sp, cname.as_ptr(), cvalue.as_ptr(), 1) };
    if rc == sys::ESPANK_SUCCESS as sys::spank_err_t {
        Ok(())
    } else {
        Err(SpankError::Setenv {
            name: name.to_string(),
            code: rc,
        })
    }
}

/// Sets a variable in the job's control environment
/// (`spank_job_control_setenv`: srun, sbatch and salloc only). Slurm sends
/// it to slurmctld in the job's `spank_job_env`, where job_submit.lua reads
/// it, as it reads the job options.
///
/// # Safety
/// `sp` must be the handle of the current callback.
pub unsafe fn job_control_setenv(
    sp: sys::spank_t,
    name: &str,
    value: &str,
) -> Result<(), SpankError> {
    let (cname, cvalue) = c_strings(name, value)?;
    // SAFETY: both strings are NUL-terminated and outlive the call (Slurm
    // copies them).
    let rc = unsafe { sys::spank_job_control_setenv(sp, cname.as_ptr(), cvalue.as_ptr(), 1) };
    if rc == sys::ESPANK_SUCCESS as sys::spank_err_t {
        Ok(())
    } else {
        Err(SpankError::JobControlSetenv {
            name: name.to_string(),
            code: rc,
        })
    }
}

/// Registers one job option. The `spank_option` struct is leaked on
/// purpose: Slurm keeps the pointer for the life of the process (and
/// `init` runs once per process), and a static `spank_options` table was
/// not picked up by sbatch 22.05 in our tests, while
/// `spank_option_register` works in every context.
///
/// # Safety
/// `sp` must be the handle of the current (init) callback.
pub unsafe fn register_option(
    sp: sys::spank_t,
    name: &'static CStr,
    arginfo: &'static CStr,
    usage: &'static CStr,
    val: c_int,
    cb: sys::spank_opt_cb_f,
) -> Result<(), SpankError> {
    let opt = Box::leak(Box::new(sys::spank_option {
        name: name.as_ptr().cast_mut(),
        arginfo: arginfo.as_ptr().cast_mut(),
        usage: usage.as_ptr().cast_mut(),
        has_arg: 1,
        val,
        cb,
    }));
    // SAFETY: `opt` lives forever; its strings are 'static.
    let rc = unsafe { sys::spank_option_register(sp, opt) };
    if rc == sys::ESPANK_SUCCESS as sys::spank_err_t {
        Ok(())
    } else {
        Err(SpankError::RegisterOption {
            option: name.to_string_lossy().into_owned(),
            code: rc,
        })
    }
}
