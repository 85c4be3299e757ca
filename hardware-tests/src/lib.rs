//! Simulators and the tests that run the real mappers against them. Intentionally empty until
//! the Modbus mapper issue.
