//! edgecore: edgehub, metamanager, eventbus, the DMI server and edged. Intentionally empty
//! until the edge-twin issue.
