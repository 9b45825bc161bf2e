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
        #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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

        // Stored as its text in Postgres (the collector's columns): decoding unknown text is an
        // error, never a default.
        #[cfg(feature = "sqlx")]
        impl sqlx::Type<sqlx::Postgres> for $name {
            fn type_info() -> sqlx::postgres::PgTypeInfo {
                <&str as sqlx::Type<sqlx::Postgres>>::type_info()
            }
            fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
                <&str as sqlx::Type<sqlx::Postgres>>::compatible(ty)
            }
        }

        #[cfg(feature = "sqlx")]
        impl sqlx::postgres::PgHasArrayType for $name {
            fn array_type_info() -> sqlx::postgres::PgTypeInfo {
                <&str as sqlx::postgres::PgHasArrayType>::array_type_info()
            }
            fn array_compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
                <&str as sqlx::postgres::PgHasArrayType>::array_compatible(ty)
            }
        }

        #[cfg(feature = "sqlx")]
        impl<'r> sqlx::Decode<'r, sqlx::Postgres> for $name {
            fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
                Ok(<&str as sqlx::Decode<sqlx::Postgres>>::decode(value)?.parse()?)
            }
        }

        #[cfg(feature = "sqlx")]
        impl sqlx::Encode<'_, sqlx::Postgres> for $name {
            fn encode_by_ref(
                &self,
                buf: &mut sqlx::postgres::PgArgumentBuffer,
            ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
                <&str as sqlx::Encode<sqlx::Postgres>>::encode(self.as_str(), buf)
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
