//! What the configuration tests of the relay and the client share (`relay_tests.rs`,
//! `client_tests.rs`): a bad value is an error that names its option.

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
