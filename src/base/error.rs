//! Errors of the core and the C status codes, both generated from one table (`statuses!`).

/// The one list of statuses: each row gives the C constant, its value, the core [`Error`]
/// variant (every status but `KVE_OK`) and the one-line message. It generates the enum, the
/// `KVE_*` constants and [`codes::STATUSES`] (which the header's `#define`s, `kve_status_name`
/// and `kve_status_message` read), and the conversions both ways.
macro_rules! statuses {
    (
        $(#[$okm:meta])* $ok:ident = $okcode:literal: $okmsg:literal;
        $( $(#[$m:meta])* $name:ident = $code:literal => $variant:ident: $msg:literal; )*
    ) => {
        /// Why a call was rejected. Nothing was written to caller buffers when one is
        /// returned. The discriminant is the variant's C status code.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(i32)]
        pub enum Error {
            $( $(#[$m])* $variant = $code, )*
        }

        /// The C status codes (`int32_t`), re-exported by `capi`.
        pub mod codes {
            $(#[$okm])*
            pub const $ok: i32 = $okcode;
            $( pub const $name: i32 = $code; )*

            /// Every status: (code, name, message), the strings NUL-terminated for C.
            pub const STATUSES: &[(i32, &str, &str)] = &[
                ($okcode, concat!(stringify!($ok), "\0"), concat!($okmsg, "\0")),
                $( ($code, concat!(stringify!($name), "\0"), concat!($msg, "\0")), )*
            ];
        }

        impl Error {
            /// Every variant, in code order.
            pub const ALL: &'static [Error] = &[$(Error::$variant),*];

            /// The C status code.
            pub const fn status(self) -> i32 {
                self as i32
            }

            /// The error of a C status code; `None` for `KVE_OK` and unknown codes.
            pub const fn from_status(code: i32) -> Option<Error> {
                match code {
                    $( $code => Some(Error::$variant), )*
                    _ => None,
                }
            }

            /// The C constant's name, e.g. `"KVE_ERR_ALIASING"`.
            pub const fn name(self) -> &'static str {
                match self {
                    $( Error::$variant => stringify!($name), )*
                }
            }

            /// A short, stable description.
            pub const fn message(self) -> &'static str {
                match self {
                    $( Error::$variant => $msg, )*
                }
            }
        }
    };
}

statuses! {
    /// Success.
    KVE_OK = 0: "success";
    /// A required pointer or slice was null / missing.
    KVE_ERR_NULL_POINTER = 1 => NullPointer: "a required pointer is null";
    /// A size, count or parameter is out of its documented range.
    KVE_ERR_INVALID_ARGUMENT = 2 => InvalidArgument: "an argument is out of its valid range";
    /// A size computation overflowed (`usize`, or the 2^31 token limit).
    KVE_ERR_OVERFLOW = 3 => Overflow: "a size computation overflows";
    /// A view's strides and extents reach past the buffer it declares.
    KVE_ERR_OUT_OF_BOUNDS = 4 => OutOfBounds: "a view reaches past the end of its buffer";
    /// A pointer is not aligned for its dtype.
    KVE_ERR_MISALIGNED = 5 => Misaligned: "a pointer is misaligned for its dtype";
    /// An unknown dtype, scorer, pool, allocator, ... value.
    KVE_ERR_BAD_ENUM = 6 => BadEnum: "an enumeration value is unknown";
    /// NaN or infinity in an input (or a score it produced).
    KVE_ERR_NON_FINITE = 7 => NonFinite: "NaN or infinity in an input or a result";
    /// An output buffer is smaller than its size query says.
    KVE_ERR_OUTPUT_TOO_SMALL = 8 => OutputTooSmall: "an output buffer is too small";
    /// The workspace is smaller than its size query says.
    KVE_ERR_WORKSPACE_TOO_SMALL = 9 => WorkspaceTooSmall: "the workspace is too small";
    /// Two buffers that must be distinct overlap.
    KVE_ERR_ALIASING = 10 => Aliasing: "input and output buffers overlap";
    /// Shapes of the inputs disagree with each other.
    KVE_ERR_SHAPE_MISMATCH = 11 => ShapeMismatch: "input shapes disagree";
    /// A CUDA entry point of a library built without the `cuda` feature (C layer only).
    KVE_ERR_NOT_BUILT_WITH_CUDA = 12 => NotBuiltWithCuda:
        "the library was built without the cuda feature";
    /// A CUDA launcher refused its arguments or failed to launch (device paths only).
    KVE_ERR_CUDA = 13 => Cuda: "a CUDA call failed (see cudaGetLastError)";
    /// Reserved for an internal error; never returned (built with `panic = "abort"`).
    KVE_ERR_PANIC = 14 => Panic: "internal error (reserved, never returned)";
    /// A tensor's dtype is known but this function cannot take it: the block-quantized
    /// `Q8_0`/`Q4_0` (host strided views only) given to a device function or a paged pool.
    KVE_ERR_UNSUPPORTED_DTYPE = 15 => UnsupportedDtype:
        "this function does not take the tensor's dtype (Q8_0/Q4_0: host strided views only)";
    /// A callback the caller gave returned nonzero (`kve_evictor_round.fill`).
    KVE_ERR_CALLBACK = 16 => Callback: "a callback the caller gave returned nonzero";
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.message())
    }
}

#[cfg(feature = "std")]
impl std::error::Error for Error {}

pub type Result<T> = core::result::Result<T, Error>;

/// Largest token count the library accepts (positions are stored as u32, ties use 31 bits).
pub const MAX_TOKENS: usize = 1 << 31;

/// Most (layer, KV head) units a model may have: unit indices stay below 2^31 and their
/// offsets (`units + 1` entries) are addressable.
pub const MAX_UNITS: usize = 1 << 31;

/// Most layers a model may have (size queries loop over layers; real models have < 1000).
pub const MAX_LAYERS: usize = 1 << 20;

#[inline]
pub(crate) fn mul(a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b).ok_or(Error::Overflow)
}
#[inline]
pub(crate) fn add(a: usize, b: usize) -> Result<usize> {
    a.checked_add(b).ok_or(Error::Overflow)
}

#[cfg(test)]
mod tests {
    use super::codes::*;
    use super::Error;

    /// The table's promises: distinct codes and names, a message each, `KVE_OK` = 0 and
    /// alone without a variant, and code → error → code / name / message round trips.
    #[test]
    fn statuses_round_trip() {
        assert_eq!(STATUSES.len(), Error::ALL.len() + 1);
        assert_eq!(STATUSES[0], (KVE_OK, "KVE_OK\0", "success\0"));
        assert_eq!(Error::from_status(KVE_OK), None);
        for (i, &(code, name, msg)) in STATUSES.iter().enumerate() {
            for &(c, n, _) in &STATUSES[..i] {
                assert!(c != code && n != name, "{name} repeats a code or a name");
            }
            for s in [name, msg] {
                assert!(s.len() > 1 && s.find('\0') == Some(s.len() - 1), "{s:?}");
            }
            assert!(name.starts_with(if code == 0 { "KVE_OK" } else { "KVE_ERR_" }));
            if code == KVE_OK {
                continue;
            }
            let e = Error::from_status(code).expect("every error code has a variant");
            assert_eq!(e.status(), code);
            assert_eq!(e.name(), name.trim_end_matches('\0'));
            assert_eq!(e.message(), msg.trim_end_matches('\0'));
            assert_eq!(Error::ALL[i - 1], e, "ALL is in code order");
        }
        for code in [-1, 17, 0x100, i32::MIN, i32::MAX] {
            assert_eq!(Error::from_status(code), None);
        }
        // spot checks against the values the C header has always had (ABI)
        assert_eq!((KVE_ERR_NULL_POINTER, Error::Aliasing.status()), (1, 10));
        assert_eq!((KVE_ERR_NOT_BUILT_WITH_CUDA, KVE_ERR_PANIC), (12, 14));
        assert_eq!((KVE_ERR_UNSUPPORTED_DTYPE, KVE_ERR_CALLBACK), (15, 16));
    }
}
