#![no_main]
// Body and properties: chive_fuzz_targets::client_core (fuzz/targets/src).
libfuzzer_sys::fuzz_target!(|data: &[u8]| chive_fuzz_targets::client_core(data));
