package apiserver

// WithCaller lets external tests serve a connection as a chosen caller
// (e.g. a non-admin user while the tests run as root).
var WithCaller = withCaller
