/* Placeholder until the rpc module lands; removed with it. */
int rpc__placeholder;
