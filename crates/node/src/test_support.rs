//! What the configuration tests of the relay and the client share (`relay_tests.rs`,
//! `client_tests.rs`): a bad value is an error that names its option; the `Link*` options'
//! range checks, which both files run.

/// Asserts that `validate` refuses each config text of `cases` with an error whose text
/// (with its causes: `{:#}`) contains the option name given beside it.
pub(crate) fn assert_refused_naming<T, E: std::fmt::Display>(
    validate: impl Fn(&str) -> Result<T, E>,
    cases: &[(&str, &str)],
) {
    for (bad, name) in cases {
        match validate(bad) {
            Ok(_) => panic!("{bad:?} was accepted; it should be refused naming {name}"),
            Err(err) => assert!(format!("{err:#}").contains(name), "{bad}: {err:#}"),
        }
    }
}

/// Asserts that `validate` (a config file with the given extra text, validated) takes
/// `LinkUnsentLimit = 0` (no limit) and refuses values below 4096 or above 16 MiB, naming the
/// option.
pub(crate) fn assert_unsent_limit_range_checked<T, E: std::fmt::Display>(
    validate: impl Fn(&str) -> Result<T, E>,
) {
    assert!(validate("LinkUnsentLimit = 0").is_ok());
    assert_refused_naming(
        validate,
        &[
            ("LinkUnsentLimit = 100", "LinkUnsentLimit"),
            ("LinkUnsentLimit = 20000000", "LinkUnsentLimit"),
        ],
    );
}

/// Asserts that `validate` takes `LinkCongestionControl = "reno"` (every Linux kernel has it)
/// and refuses an algorithm the kernel does not offer, naming the option.
pub(crate) fn assert_congestion_control_checked<T, E: std::fmt::Display>(
    validate: impl Fn(&str) -> Result<T, E>,
) {
    assert!(validate("LinkCongestionControl = \"reno\"").is_ok());
    assert_refused_naming(
        validate,
        &[(
            "LinkCongestionControl = \"no-such-cc\"",
            "LinkCongestionControl",
        )],
    );
}
