/// Declares a domain enum that mirrors a protobuf enum: serde names in snake_case, a
/// `TryFrom<i32>` that rejects UNSPECIFIED and unknown values, and `From<Self> for i32`.
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident : $wire:path as $label:literal {
            $( $(#[$vmeta:meta])* $variant:ident = $wirevariant:ident => $text:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $( $(#[$vmeta])* $variant ),+
        }

        impl $name {
            /// Every value, in wire order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The stable lower-case name used in JSON, SQL and the CLI.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.pad(self.as_str()) // honours width and alignment in tables
            }
        }

        impl std::str::FromStr for $name {
            type Err = $crate::convert::WireError;
            fn from_str(s: &str) -> Result<Self, $crate::convert::WireError> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err($crate::convert::WireError::UnknownName { what: $label, value: s.to_owned() }),
                }
            }
        }

        impl TryFrom<i32> for $name {
            type Error = $crate::convert::WireError;
            fn try_from(v: i32) -> Result<Self, $crate::convert::WireError> {
                use $wire as W;
                match W::try_from(v) {
                    $(Ok(W::$wirevariant) => Ok($name::$variant),)+
                    _ => Err($crate::convert::WireError::UnknownEnum { what: $label, value: v }),
                }
            }
        }

        impl From<$name> for i32 {
            fn from(v: $name) -> i32 {
                use $wire as W;
                match v { $($name::$variant => W::$wirevariant as i32),+ }
            }
        }
    };
}

pub(crate) use wire_enum;
