"""Security for the cross-cluster links: certificates (`certs`), TLS contexts built from them and
checked up front (`tls`), and the router's API keys (`apikey`)."""
