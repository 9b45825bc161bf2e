int nixl_fake_post_xfer(int status);
int main(void) {
    int sum = 0;
    sum += nixl_fake_post_xfer(-3);
    sum += nixl_fake_post_xfer(5);
    sum += nixl_fake_post_xfer(-7);
    return sum == -5 ? 0 : 1;
}
