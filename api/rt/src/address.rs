//! MQTT broker addresses as configs give them: `host:port`, or KubeEdge's URL form
//! (`tcp://127.0.0.1:1883`, as in its `mqttServerExternal`). Other schemes are refused, since
//! only plain TCP is spoken.

/// Why a broker address was refused; each names the address as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    #[error("{address:?}: {scheme}:// is not supported; give host:port or tcp://host:port")]
    Scheme { address: String, scheme: String },
    #[error("{address:?} is not host:port")]
    NoPort { address: String },
    #[error("{port:?} in {address:?} is not a port number")]
    BadPort { address: String, port: String },
    #[error("{address:?} has no host")]
    NoHost { address: String },
}

/// Splits a broker address into host and port; `default_port` stands in for a missing one
/// (`None`: the port is required).
pub fn split_host_port(
    address: &str,
    default_port: Option<u16>,
) -> Result<(String, u16), AddressError> {
    let bare = ["tcp://", "mqtt://"]
        .iter()
        .find_map(|scheme| address.strip_prefix(scheme))
        .unwrap_or(address)
        .trim_end_matches('/');
    if let Some((scheme, _)) = bare.split_once("://") {
        return Err(AddressError::Scheme {
            address: address.into(),
            scheme: scheme.into(),
        });
    }
    let (host, port) = match (bare.rsplit_once(':'), default_port) {
        (Some((host, port)), _) => {
            let port = port.parse::<u16>().map_err(|_| AddressError::BadPort {
                address: address.into(),
                port: port.into(),
            })?;
            (host, port)
        }
        (None, Some(port)) => (bare, port),
        (None, None) => {
            return Err(AddressError::NoPort {
                address: address.into(),
            });
        }
    };
    if host.is_empty() {
        return Err(AddressError::NoHost {
            address: address.into(),
        });
    }
    Ok((host.trim_matches(['[', ']']).to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeedge_url_form_of_the_broker_address_is_accepted() {
        assert_eq!(
            split_host_port("tcp://127.0.0.1:1883", None),
            Ok(("127.0.0.1".to_string(), 1883))
        );
        assert_eq!(
            split_host_port("mqtt://broker.local:1884/", None),
            Ok(("broker.local".to_string(), 1884))
        );
        assert_eq!(
            split_host_port("[::1]:1883", None),
            Ok(("::1".to_string(), 1883))
        );
        let e = split_host_port("ssl://127.0.0.1:8883", None).expect_err("TLS is refused");
        assert!(e.to_string().contains("ssl:// is not supported"), "{e}");
    }

    #[test]
    fn a_missing_port_is_the_default_or_an_error() {
        assert_eq!(
            split_host_port("tcp://broker", Some(1883)),
            Ok(("broker".to_string(), 1883))
        );
        assert!(matches!(
            split_host_port("broker", None),
            Err(AddressError::NoPort { .. })
        ));
        assert!(matches!(
            split_host_port("broker:http", Some(1883)),
            Err(AddressError::BadPort { .. })
        ));
        assert!(matches!(
            split_host_port(":1883", None),
            Err(AddressError::NoHost { .. })
        ));
    }
}
