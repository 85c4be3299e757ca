//! cloudcore: cloudhub, edgecontroller, synccontroller, certificates and the standalone API
//! store. Intentionally empty until its issue.
