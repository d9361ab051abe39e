# protoc-c names service-stub members after the methods, so Worker.Register
# becomes a member called `register`, a C keyword. rlorch uses gRPC, not these
# stubs; renaming the member keeps the generated header valid C.
file(READ ${HEADER} text)
string(REPLACE "(*register)" "(*register_)" text "${text}")
file(WRITE ${HEADER} "${text}")
